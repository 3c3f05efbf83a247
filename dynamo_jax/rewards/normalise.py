"""Text normalisation applied to every completion and gold before any check or parser sees it.

One spelling per symbol, so that the checks after it (the one-answer rule, number literals,
math-verify's grammar) need to know only ASCII/LaTeX:

- NFKC (fullwidth `１２` → `12`, `ﬁ` → `fi`, `½` → `1⁄2` → `1/2`), other decimal digits
  (`٣` → `3`) and superscript digits (`x²` → `x^{2}`, kept apart from NFKC's `x2`);
- minus signs and hyphens (`−`, `‒`, `‐`, `﹣`) → `-`; a dash between two numbers (`12–13`)
  is a range, written ` to ` so that it reads as two values;
- math symbols to their LaTeX macro: `±` `∓` `∨` `∧` `×` `·` `÷` `≤` `≥` `≠` `∞` `π` `√` `°`
  `∪` `∩` `∈`;
- digit groups: `1\\,000`, `1{,}000` and `32,\\!348` are `1000`, `1000` and `32,348`;
- currency: `\\$` and a leading `$` that opens no math (`$2.50`) are dropped, so a gold written
  `\\$18.90` is the number 18.90 (it used to make every completion a parse_error).

Linear-time translation and regular expressions only; ASCII text without `\\$` is returned as is.
"""

from __future__ import annotations

import re
import unicodedata

_SUPERSCRIPT_DIGITS = "⁰¹²³⁴⁵⁶⁷⁸⁹"
_SUPERSCRIPT_RUN = re.compile(f"[{_SUPERSCRIPT_DIGITS}]+")
_SUPERSCRIPT_TO_ASCII = str.maketrans(_SUPERSCRIPT_DIGITS, "0123456789")
_NON_ASCII_DIGIT = re.compile(r"(?![0-9])\d")
# A dash between two numbers is a range ("12–13"), one elsewhere a minus sign.
_RANGE_DASH = re.compile(r"(?<=\d)\s*[–—]\s*(?=[-+]?\d)")
_SYMBOLS = str.maketrans(
    {
        "−": "-",
        "‒": "-",
        "‐": "-",
        "‑": "-",
        "﹣": "-",
        "–": "-",
        "—": "-",
        "⁄": "/",
        "∕": "/",
        "±": " \\pm ",
        "∓": " \\mp ",
        "∨": " \\lor ",
        "∧": " \\land ",
        "×": " \\times ",
        "·": " \\cdot ",
        "⋅": " \\cdot ",
        "÷": " \\div ",
        "≤": " \\le ",
        "≥": " \\ge ",
        "≠": " \\ne ",
        "∞": " \\infty ",
        "π": " \\pi ",
        "√": "\\sqrt ",
        "°": "^\\circ ",
        "∪": " \\cup ",
        "∩": " \\cap ",
        "∈": " \\in ",
    }
)
# `\$` anywhere, or a `$` before a number that no later `$` closes ("$2.50", " \$ 54.60").
_CURRENCY = re.compile(r"\\\$|^\s*\$(?=\s*[-+]?\.?\d)(?![^$]*\$)")

# A thin space or `{,}` between digit groups (`1\\,000`, `32,\\!348`, `1{,}000`) is one number.
_DIGIT_GROUP = re.compile(r"(?<=\d)(,?)(?:\\[,!;: ]|\{,\}|~)(?=\d{3}(?!\d))")


def normalise(text: str) -> str:
    """`text` with one spelling per symbol (see the module docstring)."""
    if not text.isascii():
        text = _SUPERSCRIPT_RUN.sub(
            lambda m: "^{" + m.group(0).translate(_SUPERSCRIPT_TO_ASCII) + "}", text
        )
        text = unicodedata.normalize("NFKC", text)
        text = _NON_ASCII_DIGIT.sub(lambda m: str(unicodedata.digit(m.group(0), 0)), text)
        text = _RANGE_DASH.sub(" to ", text)
        text = text.translate(_SYMBOLS)
    if "$" in text:
        text = _CURRENCY.sub("", text)
    if "\\" in text or "~" in text or "{,}" in text:
        text = _DIGIT_GROUP.sub(r"\1", text)
    return text
