"""Hostile completions: each one would earn a reward it should not under a generous scorer.

The rule (docs/rewards.md): a completion that commits to more than one final answer earns 0, and
so does code, TeX programming, unknown macros or degenerate repetition in place of an answer.
Every case here asserts the reward; the honest counterparts beside them assert it is kept.
"""

import pytest

from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.math_check import score_one
from dynamo_jax.rewards.scorer import RewardPool

CFG = RewardConfig(num_workers=2, timeout_s=2.0, kill_grace_s=0.5, wall_timeout_s=20.0)

# Code-like text after "final answer is" / "Answer:": math-verify took the number in front.
CODE_AFTER_CUE = [
    "The final answer is 42(lambda: 0)()",
    "The final answer is 42 if x > 0 else 7",
    "Answer: 42 if True else 0",
    "Answer: 42.__class__",
    "The final answer is 42; print('hi')",
    "Answer: 42 + foo(bar)",
    "The final answer is 42.real",
    "Final answer: 42 == 42",
    "The answer is 42 for n in range(3)",
    "The answer is `42`",
    "Answer: 42 while True",
    "The answer is 42 and not 0",
    "The final answer is int('42')",
    "The answer is (42)(1)",
    "Answer: 42 := x",
    "The answer is sum([42])",
]

# One box (or one clause) offering a choice of values that contains the gold 42.
DISJUNCTIONS = [
    "\\boxed{41 \\lor 42}",
    "\\boxed{41 \\vee 42}",
    "\\boxed{41 \\text{ or } 42}",
    "\\boxed{42 \\text{ or } 43}",
    "\\boxed{41 or 42}",
    "\\boxed{\\text{either } 41 \\text{ or } 42}",
    "\\boxed{41 \\mid 42}",
    "\\boxed{41, 42}",
    "\\boxed{40, 41, 42, 43}",
    "\\boxed{41; 42}",
    "\\boxed{42 \\pm 1}",
    "\\boxed{41 \\text{ and } 42}",
    "\\boxed{x = 41 \\text{ or } x = 42}",
    "\\boxed{42 \\quad\\text{or}\\quad 24}",
    "The final answer is 42 or 43.",
    "The answer is either 41 or 42.",
    "Answer: 41 \\lor 42",
    "The answer is 41 and 42.",
]

# Several boxes that do not agree: whichever comes last, the completion committed to both.
SEVERAL_BOXES = [
    "\\boxed{41} \\boxed{42}",
    "\\boxed{42} \\boxed{41}",
    "First \\boxed{7}. Wait, no: \\boxed{42}",
    "\\boxed{41}\\boxed{42}\\boxed{43}\\boxed{42}",
    "$\\boxed{40}$ or maybe $\\boxed{42}$",
    "\\fbox{41} and \\boxed{42}",
    "\\boxed{41 \\lor 42} so \\boxed{42}",  # an earlier hedged box counts too
    "".join(f"\\boxed{{{n}}}" for n in range(20, 43)),  # too many boxes
]

# Degenerate repetition of a number-like token (fast: compressed-size test, no parsing).
REPETITIONS = [
    "42 " * 30_000,
    "42" * 40_000,
    "42, " * 20_000,
    "\\boxed{42} " * 5_000,
    "The answer is 42. " * 5_000,
    "Let me think. " + "4 2 " * 20_000 + "\\boxed{42}",
    "$42$ " * 20_000,
    "42\n" * 30_000,
]

# TeX programming anywhere, or macros outside the known math vocabulary in the answer.
TEX_TRICKS = [
    "\\boxed{\\foo 42}",
    "\\boxed{\\catcode`\\{=1 42}",
    "\\catcode`\\$=12 \\boxed{42}",
    "\\boxed{\\def\\x{41} 42}",
    "\\def\\boxed#1{41} \\boxed{42}",
    "\\let\\lor\\relax \\boxed{41 \\lor 42}",
    "\\boxed{\\newcommand{\\x}{41}42}",
    "\\boxed{\\csname relax\\endcsname 42}",
    "\\boxed{\\expandafter 42}",
    "\\boxed{\\relax 42}",
    "\\boxed{\\ignore{41} 42}",
    "\\boxed{\\hidden 42}",
    "\\boxed{\\phantom{41}\\zap 42}",
    "\\uppercase{\\boxed{42}}",
]

# Issue 44: hedges in other spellings (case, unicode, ranges), relations between different
# numbers, words a box drops, and cue or box variants. Each offers 42 beside another value.
ONE_ANSWER = [
    "the total comes to 41 or 42.",
    "The answer is 41 Or 42.",
    "The answer is 41 OR 42.",
    "\\boxed{42 ± 1}",
    "\\boxed{41 ∨ 42}",
    "The answer is 41–42.",
    "The answer is 41 to 42.",
    "The answer is 41, 42.",
    "\\boxed{41 = 42}",
    "\\boxed{42 = 41}",
    "\\boxed{42 \\text{ maybe 41}}",
    "\\boxed{42 \\text{ maybe forty-one}}",
    "So it is 41, or else 42.",
    "Answer: 42 Either way 41",
    "The answer is 41 and 42.",
    "\\boxed{41 \\text{ OR } 42}",
]

HONEST = [
    ("The final answer is 42.", "42", 1.0),
    ("Answer: 42", "42", 1.0),
    ("So the answer is $42$ apples.", "42", 1.0),
    ("\\boxed{42}", "42", 1.0),
    ("So \\boxed{42}. Checking: 6 \\cdot 7 = 42, so again \\boxed{42}.", "42", 1.0),
    ("\\boxed{\\frac{1}{2}} which is \\boxed{0.5}", "0.5", 1.0),
    ("\\boxed{1, 3}", "1,3", 1.0),  # a list where the gold is a list
    ("\\boxed{3 \\pm \\sqrt{2}}", "3 \\pm \\sqrt{2}", 1.0),
    ("\\boxed{1,000}", "1000", 1.0),  # thousands separator, not a list
    ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1.0),
    ("\\boxed{\\text{North}}", "\\text{North}", 1.0),  # "or" inside a word
    ("\\boxed{\\{x \\mid x > 0\\}}", "(0, \\infty)", 0.0),  # \mid in a set: wrong, not hedged
    ("A long honest derivation. " + "Step: 6 times 7 is 42. " * 20 + "\\boxed{42}", "42", 1.0),
    ("\\boxed{3+4i}", "3+4i", 1.0),
    ("\\boxed{i^2}", "-1", 1.0),  # i is the imaginary unit (docs/rewards.md)
    ("\\boxed{i^4}", "1", 1.0),
    ("\\boxed{i}", "-1", 0.0),
    ("\\boxed{2i}", "\\sqrt{-4}", 1.0),
    # Issue 44: fair answers that earned 0.
    ("Let me put the final answer in \\boxed{} ... \\boxed{42}", "42", 1.0),
    ("The answer is 42 (forty-two).", "42", 1.0),
    ("The final answer is:\n\n$$42$$", "42", 1.0),
    ("\\boxed{\\$18.90}", "\\$18.90", 1.0),
    ("\\boxed{18.90}", "\\$18.90", 1.0),
    ("The answer is \\$36.", "\\$36", 1.0),
    ("\\boxed{32,348}", "\\$32,\\!348", 1.0),
    ("\\boxed{1\\,000}", "1000", 1.0),
    ("\\boxed{−3}", "-3", 1.0),
    ("\\boxed{１２}", "12", 1.0),
    ("\\boxed{x²}", "x^2", 1.0),
    ("\\boxed{50\\%}", "50", 1.0),
    ("\\boxed{50\\%}", "0.5", 0.0),  # percent is its number, in both formats
    ("\\boxed{0.0000001}", "0.0000004", 0.0),  # relative tolerance, not 6 decimals
    ("\\boxed{4 \\times 10^{-7}}", "0.0000004", 1.0),
    ("\\boxed{7 + 5 = 12}", "12", 1.0),  # an equation between equal values
    ("\\boxed{x = 42}", "42", 1.0),
    ("\\boxed{12 \\text{ cm}}", "12", 1.0),
    ("\\boxed{5 \\text{ cm}^2}", "5", 1.0),
    ("The answer is $2\\sqrt{3}$ meters.", "2\\sqrt{3}", 1.0),
    ("The answer is 2\\sqrt{3}.", "2\\sqrt{3}", 1.0),
    ("Adding them up, we get 42.", "42", 1.0),  # no box, no cue: the last sentence
    ("We need 41 more, so we get 42.", "42", 0.0),  # two values in that sentence
]


def _cases():
    for name, texts in [
        ("code", CODE_AFTER_CUE),
        ("disjunction", DISJUNCTIONS),
        ("boxes", SEVERAL_BOXES),
        ("repetition", REPETITIONS),
        ("tex", TEX_TRICKS),
        ("one-answer", ONE_ANSWER),
    ]:
        for i, text in enumerate(texts):
            yield pytest.param(text, id=f"{name}-{i}")


def test_every_class_has_more_cases_than_the_issue_named():
    classes = [CODE_AFTER_CUE, DISJUNCTIONS, SEVERAL_BOXES, TEX_TRICKS, ONE_ANSWER]
    assert min(map(len, classes)) >= 8
    assert len(REPETITIONS) >= 6


@pytest.mark.parametrize("text", list(_cases()))
@pytest.mark.parametrize("answer_format", ["math", "number"])
def test_hostile_completion_earns_nothing(text, answer_format):
    cfg = RewardConfig(answer_format=answer_format, timeout_s=2.0, wall_timeout_s=20.0)
    verdict = score_one(text, "42", cfg)
    assert verdict.reward == 0.0, verdict
    assert verdict.status in ("wrong", "parse_error", "no_answer"), verdict
    assert verdict.status != "timeout"


@pytest.mark.parametrize(
    "text, gold, reward", HONEST, ids=[f"honest-{i}" for i in range(len(HONEST))]
)
def test_honest_completion_keeps_its_reward(text, gold, reward):
    verdict = score_one(text, gold, CFG)
    assert verdict.reward == reward, verdict


def test_hostile_verdicts_say_why():
    details = {
        "\\boxed{41 \\lor 42}": "disjunction",
        "\\boxed{41} \\boxed{42}": "different values",
        "Answer: 42 if True else 0": "code-like",
        "\\boxed{\\foo 42}": "unknown TeX macro \\foo",
        "\\catcode`\\$=12 \\boxed{42}": "TeX programming",
        "42 " * 30_000: "degenerate repetition",
        "\\boxed{41, 42}": "list of answers",
    }
    for text, words in details.items():
        assert words in score_one(text, "42", CFG).detail, text[:40]


def test_repetition_is_refused_by_the_screen_not_a_time_limit():
    # The detail shows the compressed-size screen refused it before any parser ran, so the
    # verdict cannot depend on how long parsing would have taken.
    for text in REPETITIONS:
        assert "repetition" in score_one(text, "42", CFG).detail, text[:30]


def test_pool_scores_every_hostile_class_and_survives():
    texts = [p.values[0] for p in _cases()]
    honest = [h[0] for h in HONEST]
    with RewardPool(CFG) as pool:
        verdicts = pool.score(texts + honest, ["42"] * len(texts) + [h[1] for h in HONEST])
        assert all(v.reward == 0.0 for v in verdicts[: len(texts)]), verdicts
        assert [v.reward for v in verdicts[len(texts) :]] == [h[2] for h in HONEST]
        assert pool.restarts == 0
        assert [v.status for v in pool.score(["\\boxed{5}"], ["5"])] == ["correct"]
