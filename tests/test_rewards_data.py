"""Every gold in the project's data earns with its own value, in the forms a model writes it.

A gold the scorer cannot match is a prompt that can never be learned or counted: before issue
44, the 21 golds of train.parquet written with `\\$` (`\\$18.90`) made every completion a
parse_error. Each data file under data/ is read whole; the arithmetic data is scored under both
answer formats (its configs use "number"). Files with more than 1,000 distinct golds belong to
the slow tier.
"""

import pytest

from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.math_check import score_one
from dynamo_jax.rewards.worker import warm_up
from tests.helpers.gold_forms import ROOT, data_files, data_golds, model_forms

# The default CPU safety net (20 s), so that the work budget alone decides time-outs (a loaded
# machine inflates CPU time: one run at load average 30 lost one gold under 5 s).
CFG = {fmt: RewardConfig(answer_format=fmt) for fmt in ("math", "number")}
_LARGE = 1000


def _cases():
    for path in data_files():
        name = str(path.relative_to(ROOT))
        formats = ["math", "number"] if "arith" in path.parts else ["math"]
        large = len(data_golds(path)) > _LARGE
        for fmt in formats:
            marks = [pytest.mark.slow] if large else []
            yield pytest.param(path, fmt, id=f"{name}-{fmt}", marks=marks)


def test_every_data_file_is_covered():
    names = {str(p.relative_to(ROOT)) for p in data_files()}
    assert {"data/math/test.jsonl", "data/math/train.parquet", "data/arith/train.jsonl"} <= names


@pytest.mark.parametrize("path, answer_format", list(_cases()))
def test_every_gold_earns_in_the_forms_a_model_writes(path, answer_format):
    cfg = CFG[answer_format]
    warm_up(cfg)
    failed = []
    for gold in data_golds(path):
        for text in model_forms(gold):
            verdict = score_one(text, gold, cfg)
            if verdict.reward != 1.0:
                failed.append((gold, text, verdict.status, verdict.detail))
    assert not failed, f"{len(failed)} forms earn nothing, e.g. {failed[:5]}"


@pytest.mark.parametrize(
    "gold, forms",
    [
        (
            "\\$18.90",
            [
                "So the final answer is $\\boxed{18.90}$.",
                "So the final answer is \\boxed{\\$18.90}.",
                "The answer is 18.90.",
            ],
        ),
        (
            "12 \\text{ cm}",
            [
                "So the final answer is $\\boxed{12 \\text{ cm}}$.",
                "\\boxed{12}",
                "The answer is 12.",
            ],
        ),
        ("1,000", ["So the final answer is $\\boxed{1,000}$.", "The answer is 1,000."]),
        (
            "$2.50",
            [
                "So the final answer is $\\boxed{2.50}$.",
                "So the final answer is \\boxed{2.50}.",
                "The answer is 2.50.",
            ],
        ),
    ],
)
def test_model_forms(gold, forms):
    assert model_forms(gold) == forms
