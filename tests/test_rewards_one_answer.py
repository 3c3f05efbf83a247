"""The one-answer invariant, as properties over generated completions (hypothesis).

The scorer reads one final answer (docs/rewards.md#one-final-answer) and the reward depends on
it alone. Completions are generated from templates (a box, a cue, a plain last sentence, two
boxes, a cue and a box) holding two values a != b with a hostile insertion between them
(disjunctions, ranges, lists, equations, `\\pm`, words, space), in case and unicode variants, and
scored against golds built from their values (a, b, their sums, differences and product, 0, 1):
- a final answer that holds both values earns against none of them;
- a value before the final answer the rule picks (a cue before a box, an earlier cue) earns
  nothing, the picked one earns against its own value only;
- reasoning before the final answer does not change the verdict.
The settings are fixed (derandomized, a fixed number of examples), so every run tries the same
cases; the count is printed (`pytest -s`).
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.math_check import score_one

EXAMPLES = 120
CFG = {fmt: RewardConfig(answer_format=fmt, timeout_s=5.0) for fmt in ("math", "number")}

# One final answer that holds both values, or two boxes (both committed): nothing earns.
ONE_ANSWER_TEMPLATES = [
    "So \\boxed{{{a}{sep}{b}}}.",
    "The final answer is $\\boxed{{{a}{sep}{b}}}$.",
    "The answer is {a}{sep}{b}.",
    "Answer: {a}{sep}{b}",
    "The final answer is:\n\n$${a}{sep}{b}$$",
    "Adding up the parts, the total comes to {a}{sep}{b}.",
    "{a}{sep}{b}",
    "\\boxed{{}} \\boxed{{{a}{sep}{b}}}",
    "\\boxed{{{a}}}{sep}\\boxed{{{b}}}",
    "First \\boxed{{{a}}}. Wait{sep}\\boxed{{{b}}}",
]
# A value, then the final answer in a place the rule ranks later: only the second one earns.
LAST_WINS_TEMPLATES = [
    "The answer is {a}.{sep}\\boxed{{{b}}}",
    "The answer is {a}.{sep}The answer is {b}.",
    "The total is {a}.{sep}Answer: {b}",
]
# Between the values: hedges, ranges, lists, relations and words, in several spellings.
INSERTIONS = [
    " or ",
    " Or ",
    " OR ",
    " ∨ ",
    " \\lor ",
    " \\vee ",
    " \\text{ or } ",
    ", ",
    "; ",
    " and ",
    "–",
    " — ",
    " to ",
    " = ",
    " \\pm ",
    " ± ",
    " \\text{ maybe } ",
    " maybe ",
    " either ",
    " (or) ",
    " ",
    " \\quad ",
    ", or else ",
    " \\mid ",
]


def _fullwidth(text: str) -> str:
    return text.translate(str.maketrans("0123456789", "０１２３４５６７８９"))


VARIANTS = {
    "plain": lambda t: t,
    "upper": lambda t: t.replace(" or ", " OR ").replace("answer", "ANSWER"),
    "fullwidth": _fullwidth,
    "unicode-minus": lambda t: t.replace("-", "−"),
}


@st.composite
def completions(draw, templates):
    a = draw(st.integers(-40, 99))
    # b >= 0: `12 -13` side by side is a difference, one value (its own gold earns)
    b = draw(st.integers(0, 99).filter(lambda v: v != a))
    template = draw(st.sampled_from(templates))
    sep = draw(st.sampled_from(INSERTIONS))
    variant = draw(st.sampled_from(sorted(VARIANTS)))
    return VARIANTS[variant](template.format(a=a, b=b, sep=sep)), a, b


def _earned(text: str, a: int, b: int, cfg: RewardConfig) -> set[int]:
    """The golds, among the values in `text` and their sums and differences, that it earns."""
    golds = {a, b, a + b, a - b, b - a, a * b, -a, -b, 0, 1}
    return {g for g in golds if score_one(text, str(g), cfg).reward == 1.0}


@pytest.mark.parametrize("answer_format", ["math", "number"])
def test_a_final_answer_with_two_values_earns_nothing(answer_format):
    cfg = CFG[answer_format]
    tried = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None)
    @given(case=completions(ONE_ANSWER_TEMPLATES))
    def check(case):
        text, a, b = case
        tried.append(text)
        assert _earned(text, a, b, cfg) == set(), text

    check()
    print(f"{answer_format}: {len(tried)} generated two-value answers, each against 10 golds")
    assert len(tried) >= EXAMPLES


@pytest.mark.parametrize("answer_format", ["math", "number"])
def test_only_the_final_answer_the_rule_picks_earns(answer_format):
    cfg = CFG[answer_format]
    tried = []

    @settings(max_examples=EXAMPLES // 2, deadline=None, derandomize=True, database=None)
    @given(case=completions(LAST_WINS_TEMPLATES))
    def check(case):
        text, a, b = case
        tried.append(text)
        assert _earned(text, a, b, cfg) == {b}, text

    check()
    print(f"{answer_format}: {len(tried)} generated completions with an earlier value")
    assert len(tried) >= EXAMPLES // 2


# Reasoning before the final answer, with numbers of its own.
PREAMBLES = [
    "We have 3 apples and 4 pears, so 7 fruits. ",
    "Let $x = 5$. Then $2x = 10$ or $x + 1 = 6$. ",
    "The answer is 17. Hmm, let me recheck. ",
    "Try 12 or 13 first.\n",
    "I will put the final answer in \\boxed{}.\n",
    "Step 1: $-3 + 8 = 5$; step 2: $5 \\cdot 2 = 10$.\n",
    "",
]
FINALS = ["\\boxed{{{a}}}", "The final answer is $\\boxed{{{a}}}$.", "Therefore the answer is {a}."]


@pytest.mark.parametrize("answer_format", ["math", "number"])
def test_the_reward_depends_on_the_final_answer_alone(answer_format):
    cfg = CFG[answer_format]
    tried = []

    @settings(max_examples=EXAMPLES // 2, deadline=None, derandomize=True, database=None)
    @given(
        preamble=st.sampled_from(PREAMBLES),
        final=st.sampled_from(FINALS),
        a=st.integers(-40, 99),
        gold=st.integers(-40, 99),
    )
    def check(preamble, final, a, gold):
        answer = final.format(a=a)
        tried.append(preamble + answer)
        alone = score_one(answer, str(gold), cfg)
        after = score_one(preamble + answer, str(gold), cfg)
        assert (after.status, after.reward) == (alone.status, alone.reward), preamble
        assert alone.reward == (1.0 if a == gold else 0.0)

    check()
    print(f"{answer_format}: {len(tried)} generated completions with a preamble")
    assert len(tried) >= EXAMPLES // 2
