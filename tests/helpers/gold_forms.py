"""The forms in which a model writes a data file's gold answer (tests/test_rewards_data.py).

A gold in the project's data is written as the dataset wrote it: `$...$` math delimiters,
`\\$` or `$` as a currency sign, `\\text{ cm}` units, thousands separators. A model writes the
same value boxed, with or without the currency sign and the unit, and, where the gold is one
number, as a plain number after "The answer is".
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

from dynamo_jax.data import load_rows
from dynamo_jax.rewards.extract import matching_braces

ROOT = Path(__file__).resolve().parents[2]
_CURRENCY = re.compile(r"\\\$|^\s*\$(?=\s*\d)(?![^$]*\$)")
# A number followed by its unit only (`12 \\text{ cm}`, `62 \\mathrm{~km} / \\mathrm{h}`, `60^\\circ`).
_NUMBER_UNIT = re.compile(
    r"([-+]?\d[\d,]*(?:\.\d+)?)\s*(?:~|\\[,;! ])*\s*"
    r"(?:(?:\\(?:text|mbox|mathrm)\s*\{\s*~?[A-Za-z ]+\}|\s*/\s*)+(?:\^\s*\{?[23]\}?)?"
    r"|\^\s*\{?\\circ\}?)"
)
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")


def data_files() -> list[Path]:
    """Every data file of the project (JSONL and parquet, under data/)."""
    paths = glob.glob(str(ROOT / "data" / "**" / "*.jsonl"), recursive=True)
    paths += glob.glob(str(ROOT / "data" / "**" / "*.parquet"), recursive=True)
    return sorted(Path(p) for p in paths)


def data_golds(path: Path) -> list[str]:
    """The distinct non-empty golds of a data file, in file order."""
    return list(dict.fromkeys(r.gold for r in load_rows(path) if r.gold.strip()))


def _unboxed(text: str) -> str:
    """`text` with every `\\boxed{X}` written X."""
    while (start := text.find("\\boxed{")) >= 0:
        close = matching_braces(text).get(start + len("\\boxed"))
        if close is None:
            return text
        text = text[:start] + text[start + len("\\boxed{") : close] + text[close + 1 :]
    return text


def bare(gold: str) -> str:
    """The gold without its `$` math delimiters and currency signs (what a box holds)."""
    text = _CURRENCY.sub("", gold)
    text = _unboxed(text)  # a gold written boxed (`\\[\\boxed{(7, 11)}\\]`)
    text += "}" * max(0, text.count("{") - text.count("}"))  # a model closes what it opens
    text = re.sub(r"\\[\[\]]", " ", text)
    return re.sub(r"\s+", " ", text.replace("$", " ")).strip().rstrip(".").strip()


def model_forms(gold: str) -> list[str]:
    """Completions that state `gold`'s own value the ways a model writes it."""
    core = bare(gold)
    forms = [f"So the final answer is $\\boxed{{{core}}}$."]
    if _CURRENCY.search(gold):  # the dataset's own spelling, with its currency sign
        spelled = gold.strip().rstrip(".").strip().strip("$")
        forms.append(f"So the final answer is \\boxed{{{spelled}}}.")
    with_unit = _NUMBER_UNIT.fullmatch(core)
    no_unit = with_unit.group(1) if with_unit else core
    if with_unit:
        forms.append(f"\\boxed{{{no_unit}}}")
    plain = no_unit.replace(",", "") if re.fullmatch(r"\d{1,3}(?:,\d{3})+", no_unit) else no_unit
    if _PLAIN_NUMBER.fullmatch(plain):
        forms.append(f"The answer is {no_unit}.")
    return forms
