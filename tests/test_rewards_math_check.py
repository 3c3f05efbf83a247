"""A verdict is a function of (completion, gold) alone: not of the hash seed, the process, or
the items scored before it."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from math_verify import parse

from dynamo_jax.rewards import math_check
from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.math_check import score_one
from dynamo_jax.rewards.worker import warm_up

C, W = "correct", "wrong"
ROOT = Path(__file__).resolve().parents[1]


def _matrix_power(a, b, c, d, n) -> str:
    return (
        "\\boxed{\\begin{pmatrix}" + f"{a} & {b}\\\\ {c} & {d}" + "\\end{pmatrix}^{" + f"{n}" + "}}"
    )


# (completion, gold, expected status). The infinity items were scored `correct` in some
# processes and `wrong` in others before SymPy's assumption order was fixed and infinities were
# evaluated (SymPy called the unevaluated `oo**oo` equal to any number, depending on a shuffled
# order of assumption queries); the matrix powers took 0.03 s or over 1 CPU s depending on that
# same order, so under a 0.6 s limit they were `wrong` in one process and `timeout` in another.
TRICKY: list[tuple[str, str, str]] = [
    ("\\boxed{\\infty^{\\infty}}", "1", W),
    ("\\boxed{\\infty^{\\infty}}", "2", W),
    ("\\boxed{\\infty^{\\infty} - 1}", "0", W),
    ("\\boxed{2\\infty^{\\infty}}", "5", W),
    ("\\boxed{\\infty^{2}}", "1", W),
    ("\\boxed{\\pi^{\\infty}}", "1", W),
    ("\\boxed{(\\infty+1)^{\\infty}}", "1", W),
    ("\\boxed{\\sqrt{\\infty^{\\infty}}}", "1", W),
    ("\\boxed{\\infty \\cdot \\infty^{\\infty}}", "1", W),
    ("\\boxed{\\{\\infty^{\\infty}\\}}", "\\{1\\}", W),
    ("\\boxed{(\\infty^{\\infty}, 1)}", "(1, 1)", W),
    # Wrong in every process before, but for a wrong reason (`exp(oo**oo)` "equal" to 1).
    ("\\boxed{e^{\\infty^{\\infty}}}", "1", W),
    # oo - oo is undefined, not 0 (it was `correct` as the unevaluated x - x).
    ("\\boxed{2^{\\infty} - 2^{\\infty}}", "0", W),
    # Evaluating infinities keeps what was right right.
    ("\\boxed{\\infty^{\\infty}}", "\\infty", C),
    ("\\boxed{[1, \\infty^{\\infty})}", "[1, \\infty)", C),
    ("\\boxed{(-\\infty, 2) \\cup (3, \\infty)}", "(-\\infty,2)\\cup(3,\\infty)", C),
    ("\\boxed{\\lim_{x\\to\\infty} \\frac{3x}{x+1} = 3}", "3", C),  # stays an equation
    ("\\boxed{x = \\infty}", "x=\\infty", C),
    (_matrix_power("\\sqrt{2}", 1, 1, "\\sqrt{3}", 200), "1", W),
    (_matrix_power("x", 1, 1, "x", 60), "1", W),
    ("\\boxed{\\frac{3}{5}}", "0.6", C),
    ("\\boxed{\\{x, y\\}}", "\\{y, x\\}", C),
]
# Ordinary items scored first in the "after other items" runs.
PRIOR = [("\\boxed{4}", "4"), ("The answer is \\frac{1}{2}.", "0.5"), ("\\boxed{x^2}", "x^2")]
LIMITS = RewardConfig(timeout_s=0.6, kill_grace_s=0.5, wall_timeout_s=20.0)
EXPECTED = [t[2] for t in TRICKY]

# Scores a JSON request from stdin in a fresh interpreter, like a pool worker (warmed up).
_CHILD = """
import json, sys
from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.math_check import score_one
from dynamo_jax.rewards.worker import warm_up
request = json.load(sys.stdin)
cfg = RewardConfig(**request["cfg"])
warm_up(cfg)
for text, gold in request["prior"]:
    score_one(text, gold, cfg)
print(json.dumps([score_one(text, gold, cfg).status for text, gold, _ in request["items"]]))
"""


def _score_in_fresh_process(hash_seed: int, prior) -> subprocess.Popen:
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    cfg = {"timeout_s": LIMITS.timeout_s, "kill_grace_s": 0.5, "wall_timeout_s": 20.0}
    proc.stdin.write(json.dumps({"cfg": cfg, "prior": prior, "items": TRICKY}))
    proc.stdin.close()
    proc.stdin = None  # already sent: communicate() must not write again
    return proc


@pytest.mark.slow
def test_verdicts_equal_across_hash_seeds_and_history():
    # Each run: a fresh interpreter with its own hash seed, with or without other items
    # (ordinary ones, then the tricky list itself in reverse) scored first.
    history = PRIOR + [(t, g) for t, g, _ in reversed(TRICKY)]
    runs = [(0, []), (7, []), (0, history), (12345, history)]
    results = {}
    for i in range(0, len(runs), 2):  # two at a time: one per core on a small machine
        batch = [
            (seed, prior, _score_in_fresh_process(seed, prior)) for seed, prior in runs[i : i + 2]
        ]
        for seed, prior, proc in batch:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-4000:]
            results[(seed, "after other items" if prior else "fresh")] = json.loads(out)
    differing = [
        (text, gold, {run: statuses[i] for run, statuses in results.items()})
        for i, (text, gold, _) in enumerate(TRICKY)
        if len({statuses[i] for statuses in results.values()}) > 1
    ]
    assert not differing, f"verdicts differ between runs: {differing}"
    wrong = [
        (t, g, got, want) for (t, g, want), got in zip(TRICKY, results[(0, "fresh")]) if got != want
    ]
    assert not wrong, f"(completion, gold, got, expected): {wrong}"


def test_verdicts_do_not_depend_on_earlier_items_in_process():
    warm_up(LIMITS)
    forward = [score_one(t, g, LIMITS).status for t, g, _ in TRICKY]
    backward = [score_one(t, g, LIMITS).status for t, g, _ in reversed(TRICKY)][::-1]
    assert forward == EXPECTED
    assert backward == EXPECTED
    for text, gold, expected in TRICKY:  # each right after a different item
        score_one(*PRIOR[len(text) % len(PRIOR)], LIMITS)
        assert score_one(text, gold, LIMITS).status == expected, (text, gold)


# Integer literals skip math-verify's parser (math_check._parsed): its own result, not a copy.
_INTEGERS = st.one_of(
    st.integers(-(10**6), 10**6), st.integers(-(10**99), 10**99), st.sampled_from([0, -0, 1, -1])
)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(_INTEGERS, st.booleans())
def test_an_integer_literal_parses_as_math_verify_parses_it(value, boxed):
    source = f"\\boxed{{{value}}}" if boxed else str(value)
    assert math_check._INTEGER_SOURCE.fullmatch(source)
    assert math_check._parsed(source) == parse(source, parsing_timeout=None)


def test_only_plain_integer_literals_skip_the_parser():
    for source in ("007", "\\boxed{007}", "1,000", "\\boxed{12", "12}", "+3", "\\boxed{ 12 }"):
        assert not math_check._INTEGER_SOURCE.fullmatch(source), source
    assert math_check._INTEGER_SOURCE.fullmatch("\\boxed{-0}")


# (completion, gold) pairs whose answer and gold are integers, in every place the scorer reads.
_INTEGER_ITEMS = [
    ("So \\boxed{29}.", "29"),
    ("So \\boxed{27}. Wait, recheck: \\boxed{29}.", "29"),
    ("\\boxed{29} and again \\boxed{29}", "29"),
    ("Therefore the final answer is $\\boxed{140}$.", "139"),
    ("The answer is 216.", "216"),
    ("The answer is -4.", "-4"),
    ("The answer is $-4$.", "4"),
    ("The answer is -4.", "4"),
    ("\\boxed{4}", "-4"),
    ("\\boxed{0}", "-0"),
    ("\\boxed{50\\%}", "50"),
    ("\\boxed{007}", "7"),
    ("We get 12 so the answer is 13", "13"),
    ("\\boxed{10^{3}}", "1000"),
    ("\\boxed{1,000}", "1000"),
    ("\\boxed{12} \\boxed{12.0}", "12"),
    ("\\boxed{12 = 13}", "12"),
]


def test_integer_verdicts_are_those_of_the_parser(monkeypatch):
    # The oracle: the same items scored with the shortcut switched off (math-verify parses all).
    cfg = RewardConfig(timeout_s=20.0)
    fast = [score_one(text, gold, cfg) for text, gold in _INTEGER_ITEMS]
    monkeypatch.setattr(math_check, "_INTEGER_SOURCE", re.compile(r"(?!)"))
    slow = [score_one(text, gold, cfg) for text, gold in _INTEGER_ITEMS]
    assert fast == slow
    assert {v.status for v in fast} == {"correct", "wrong"}
