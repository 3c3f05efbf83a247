"""reward.answer_format="number": restating the question earns nothing, a number does."""

from fractions import Fraction

import pytest

from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.math_check import score_one
from dynamo_jax.rewards.number import number_value
from dynamo_jax.rewards.scorer import RewardPool

NUMBER = RewardConfig(answer_format="number", timeout_s=2.0, wall_timeout_s=20.0)
MATH = RewardConfig(timeout_s=2.0, wall_timeout_s=20.0)

# (completion, gold): the question's own expression as the final answer. math-verify evaluates
# each of these to the gold; under "number" every one earns 0.
RESTATEMENTS = [
    ("We need to compute 86 + 66", "152"),
    ("\\boxed{86 + 66}", "152"),
    ("\\boxed{86+66}", "152"),
    ("The answer is 86 + 66.", "152"),
    ("Answer: $86 + 66$", "152"),
    ("\\boxed{12 \\times 4}", "48"),
    ("\\boxed{12 \\cdot 4}", "48"),
    ("\\boxed{93 - 17}", "76"),
    ("\\boxed{\\frac{84}{7}}", "12"),  # a division still to do
    ("\\boxed{84/7}", "12"),
    ("\\boxed{2^{10}}", "1024"),
    ("\\boxed{\\sqrt{144}}", "12"),
    ("\\boxed{(3 + 4) \\cdot 2}", "14"),
    ("\\boxed{7 + 5 = 12}", "12"),
    ("\\boxed{3!}", "6"),
    ("\\boxed{\\frac{2}{4}}", "0.5"),  # not in lowest terms
    ("So we need 45 + 38.", "83"),
    ("\\boxed{-(3)}", "-3"),
    ("\\boxed{12} \\boxed{13}", "12"),
]

# (completion, gold): numbers that must earn the reward.
NUMBERS = [
    ("12", "12"),
    ("12.0", "12"),
    ("\\boxed{12}", "12"),
    ("$\\boxed{12}$", "12"),
    ("-3", "-3"),
    ("\\boxed{-3}", "-3"),
    ("The answer is 12.", "12"),
    ("The final answer is **12**.", "12"),
    ("Answer: 12 apples", "12"),
    ("7 + 5 = 12", "12"),
    ("First, 7 + 5.\n7 + 5 = 12.", "12"),
    ("\\boxed{1/2}", "0.5"),
    ("\\boxed{\\frac{1}{2}}", "1/2"),
    ("\\boxed{-\\dfrac{3}{4}}", "-0.75"),
    ("\\boxed{0.50}", "\\frac{1}{2}"),
    ("\\boxed{1,000}", "1000"),
    ("\\boxed{12 \\text{ cm}}", "12"),
    ("\\boxed{\\mathbf{12}}", "12"),
    ("\\boxed{10\\%}", "10\\%"),
    ("\\boxed{540^\\circ}", "540"),
    ("\\boxed{025}", "025"),
    ("So \\boxed{12}. Check: 12 - 5 = 7, so \\boxed{12.0}.", "12"),
    # Issue 44: fair answers that earned 0.
    ("\\boxed{−3}", "-3"),
    ("The answer is −3.", "-3"),
    ("\\boxed{\\$12}", "12"),
    ("\\boxed{12}", "\\$12"),
    ("\\boxed{12~\\text{cm}}", "12"),
    ("\\boxed{12 \\text{ km}^2}", "12"),
    ("\\boxed{1\\frac{1}{2}}", "1.5"),
    ("\\boxed{-\\frac34}", "-0.75"),
    ("\\boxed{\\frac{-1}{2}}", "-0.5"),
    ("The final answer is:\n\n$$12$$", "12"),
    ("The final answer is:\n$$\n12\n$$", "12"),
    ("The answer is 12 (twelve).", "12"),
    ("\\boxed{1\\,000}", "1000"),
    ("\\boxed{1{,}000}", "1000"),
    ("\\boxed{１２}", "12"),
    ("\\boxed{50\\%}", "50"),
    ("Let me put the final answer in \\boxed{}. So \\boxed{12}", "12"),
]


@pytest.mark.parametrize("text, gold", RESTATEMENTS)
def test_restated_question_earns_nothing_under_number(text, gold):
    assert score_one(text, gold, NUMBER).reward == 0.0


def test_restatements_did_earn_under_the_default_math_format():
    # What the setting is for: math-verify judges most restatements equal to the gold.
    earned = [t for t, g in RESTATEMENTS if score_one(t, g, MATH).reward == 1.0]
    assert len(earned) >= 10, earned


@pytest.mark.parametrize("text, gold", NUMBERS)
def test_numbers_earn_under_number(text, gold):
    verdict = score_one(text, gold, NUMBER)
    assert verdict.status == "correct" and verdict.reward == 1.0, verdict


@pytest.mark.parametrize(
    "text, gold, status",
    [
        ("\\boxed{13}", "12", "wrong"),
        ("12.5", "12", "wrong"),
        ("I do not know.", "12", "no_answer"),
        ("\\boxed{}", "12", "no_answer"),
        ("\\boxed{x}", "12", "wrong"),
        ("\\boxed{1.4142}", "\\sqrt{2}", "wrong"),  # non-numeric gold: math-verify decides
        ("\\boxed{2}", "\\sqrt{4}", "correct"),
        ("\\boxed{12 \\text{ maybe thirteen}}", "12", "wrong"),  # a unit, not any word
        ("\\boxed{12 apples}", "12", "wrong"),
        ("\\boxed{1\\frac{3}{2}}", "2.5", "wrong"),  # a mixed number's fraction is proper
        ("\\boxed{-\\frac{-1}{2}}", "0.5", "wrong"),
        ("\\boxed{50\\%}", "0.5", "wrong"),  # percent is its number, as under "math"
        ("The answer is 12 or 13.", "12", "wrong"),
    ],
)
def test_other_outcomes_under_number(text, gold, status):
    assert score_one(text, gold, NUMBER).status == status


def test_number_literals():
    assert number_value("12") == 12 and number_value("-0.5") == -0.5
    assert number_value("\\frac{3}{4}") == 0.75 and number_value("3/4") == 0.75
    assert number_value("\\frac{6}{8}") is None and number_value("4/2") is None
    assert number_value("\\frac{6}{8}", lowest_terms=False) == 0.75
    assert number_value("1/0") is None and number_value("1e3") is None
    assert number_value("12,34") is None  # not a thousands grouping
    assert number_value("2\\frac{1}{3}") == Fraction(7, 3)
    assert number_value("-2\\frac{1}{3}") == Fraction(-7, 3)
    assert number_value("\\frac{-3}{4}") == Fraction(-3, 4)
    assert number_value("\\dfrac56") == Fraction(5, 6)
    assert number_value("2\\frac{2}{4}") is None


def test_default_format_is_unchanged_math_verify():
    assert RewardConfig().answer_format == "math"
    assert score_one("\\boxed{2^{10}}", "1024", RewardConfig()).reward == 1.0
    with pytest.raises(ValueError, match="RewardConfig.answer_format"):
        RewardConfig(answer_format="numeric")


def test_number_format_in_the_pool():
    cfg = RewardConfig(answer_format="number", num_workers=1, timeout_s=2.0, wall_timeout_s=20.0)
    with RewardPool(cfg) as pool:
        verdicts = pool.score(["\\boxed{86 + 66}", "\\boxed{152}"], ["152", "152"])
    assert [v.reward for v in verdicts] == [0.0, 1.0]
