"""`reward.answer_format = "number"`: the final answer must be a number, not an expression.

math-verify judges `\\boxed{86 + 66}` equal to 152, and so does "We need to compute 86 + 66"
(its fallback takes the last expression in the text): a model rewarded that way learns to
restate the question. Under this format the final answer must be a number literal, compared
exactly (as a fraction) with the gold:

- accepted: `12`, `-3`, `12.0`, `0.50`, `1,000`, `1\\,000`, `12 cm`, `12~\\text{cm}` (a unit
  from `screen.UNITS`, not any word), `10\\%` (= 10), `540^\\circ`, `\\mathbf{12}`, a fraction
  in lowest terms: `1/2`, `\\frac{1}{2}`, `-\\dfrac{3}{4}`, `-\\frac34`, `\\frac{-1}{2}`, and a
  mixed number `1\\frac{1}{2}` (= 3/2, its fraction proper and in lowest terms);
- refused (reward 0): any operator or call (`86 + 66`, `2^{10}`, `\\sqrt{4}`, `3 \\cdot 4`),
  a fraction not in lowest terms (`\\frac{304}{2}`, `4/2`: a division still to do).

Where the final answer is: the last box; else the clause after the last "answer is" /
"Answer:" cue, which must start with the number; else the completion's last non-empty line when
it is a number or ends in `= number` ("7 + 5 = 12"). Anything else has no answer.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from dynamo_jax.rewards.screen import PROSE_PARENTHESIS, UNITS

_WRAPPERS = re.compile(r"\\(?:mathbf|textbf|mathrm|text|mbox|boldsymbol)\s*\{\s*([^{}]*?)\s*\}")
_UNIT_NAMES = "|".join(sorted(UNITS, key=len, reverse=True))
_UNIT = re.compile(
    r"\s*~?\s*(?:\\(?:text|mbox|mathrm)\s*\{\s*(?:" + _UNIT_NAMES + r")\.?\s*\}|"
    r"(?<![A-Za-z])(?:" + _UNIT_NAMES + r")\.?)(?:\^\s*\{?[23]\}?)?\s*$"
)
_NOISE = re.compile(r"\\[,!;: ]|\{,\}|~|\\left|\\right|\*\*|\\\(|\\\)|\\\[|\\\]|\$")
_PERCENT_DEGREE = re.compile(r"(?:\\%|%|\^\s*\{?\\circ\}?|\^\s*\\circ|°)$")
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_SLASH = re.compile(r"([+-]?)(\d+)/(\d+)")
# `\\frac{1}{2}`, `\\frac{-1}{2}`, `\\frac34` (one-digit arguments need no braces), after an
# optional whole part (a mixed number, `1\\frac{1}{2}`).
_FRAC = re.compile(r"([+-]?)(\d*)\\[dt]?frac(?:\{([+-]?)(\d+)\}\{(\d+)\}|(\d)(\d))")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_CUE_NUMBER = re.compile(r"\s*(?:\$|\\\(|\*\*)*\s*([^\s$]+)")


def _normalise(text: str) -> str:
    text = text.strip().rstrip(".").strip()
    text = _UNIT.sub("", text)
    for _ in range(3):  # \mathbf{\text{12}}
        text = _WRAPPERS.sub(r"\1", text)
    text = _NOISE.sub("", text).strip()
    text = _PERCENT_DEGREE.sub("", text).strip()
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    return text.replace(" ", "")


def number_value(text: str, *, lowest_terms: bool = True) -> Fraction | None:
    """The exact value of a number literal (see the module docstring), else None."""
    text = _normalise(text)
    if _DECIMAL.fullmatch(text):
        return Fraction(text)
    whole = 0
    match = _SLASH.fullmatch(text)
    if match is not None:
        sign, num, den = match.group(1), int(match.group(2)), int(match.group(3))
    else:
        match = _FRAC.fullmatch(text)
        if match is None:
            return None
        sign, inner_sign = match.group(1), match.group(3)
        if inner_sign and (sign or match.group(2)):  # `-\\frac{-1}{2}`, `1\\frac{-1}{2}`
            return None
        sign = sign or inner_sign
        num, den = int(match.group(4) or match.group(6)), int(match.group(5) or match.group(7))
        if match.group(2):  # a mixed number: its fraction is proper
            whole = int(match.group(2))
            if num >= den:
                return None
    if den == 0 or (lowest_terms and (den == 1 or math.gcd(num, den) != 1)):
        return None
    value = whole + Fraction(num, den)
    return -value if sign == "-" else value


def cue_number(clause: str) -> str | None:
    """The number a cue clause starts with, when the rest of the clause is only prose (units)."""
    clause = PROSE_PARENTHESIS.sub(" ", clause)
    match = _CUE_NUMBER.match(clause)
    if match is None:
        return None
    token = match.group(1).rstrip(".,!;").rstrip("$").rstrip("*")
    rest = clause[match.end() :]
    if not re.fullmatch(r"[\s$*.,!]*(?:[A-Za-z][A-Za-z\s]*[.!]?)?\s*", rest):
        return None
    return token if number_value(token) is not None else None


def last_line_number(text: str) -> str | None:
    """The number the last non-empty line is, or ends in after `=` ("7 + 5 = 12")."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    last = lines[-1]
    candidate = last.rsplit("=", 1)[-1] if "=" in last else last
    candidate = candidate.strip().rstrip(".").rstrip("$").strip()
    return candidate if number_value(candidate) is not None else None
