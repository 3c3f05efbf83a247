"""The reward worker's warm-up: a fixed list of real answers, the same state in every worker."""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dynamo_jax.data import load_rows
from dynamo_jax.rewards import worker
from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.scorer import RewardPool

VALID = Path(__file__).resolve().parents[1] / "data" / "math" / "valid.parquet"
# A generous CPU net, so that only the work budget can decide these items' status.
CFG = RewardConfig(num_workers=1, timeout_s=60.0, kill_grace_s=1.0, wall_timeout_s=120.0)
# Answers of the training split's shapes, none of them in the warm-up list.
HELD_OUT = [
    ("So we get \\boxed{\\frac{\\pi m^2}{2}}.", "\\frac{\\pi m^2}{2}"),
    (
        "Therefore the final answer is $\\boxed{\\frac{p+q}{\\gcd(p,q)}}$.",
        "\\frac{p+q}{\\gcd(p,q)}",
    ),
    ("So \\boxed{2\\sqrt{7} - \\frac{\\pi}{3}}.", "2\\sqrt{7}-\\frac{\\pi}{3}"),
]


def test_the_warm_up_answers_are_the_validation_splits_non_integer_golds():
    golds = []
    for row in load_rows(VALID):
        gold = row.gold
        if gold.strip() and not re.fullmatch(r"-?\d+", gold.strip()) and gold not in golds:
            golds.append(gold)
    assert [gold for _, gold in worker.warm_up_answers()] == golds
    assert all(
        text == f"So the answer is $\\boxed{{{gold}}}$." for text, gold in worker.warm_up_answers()
    )
    assert not {gold for _, gold in HELD_OUT} & set(golds)


_COUNTS = """
import sys
from dynamo_jax.rewards import worker
from dynamo_jax.rewards.budget import calls_made
from dynamo_jax.rewards.isolate import call_isolated
from dynamo_jax.rewards.math_check import _reset_state, _score_unbounded
from dynamo_jax.rewards.config import RewardConfig
if sys.argv[1] == "cases only":
    worker.warm_up_answers = list
worker.warm_up()
def count(text, gold):
    _reset_state()
    return calls_made(_score_unbounded, text, gold, RewardConfig())
print(*[call_isolated(count, text, gold) for text, gold in eval(sys.argv[2])])
"""


def _fork_counts(warm_up: str) -> list[int]:
    """Calls each held-out item makes in a fork of a fresh interpreter warmed up so."""
    out = subprocess.run(
        [sys.executable, "-c", _COUNTS, warm_up, repr(HELD_OUT)],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONHASHSEED="0"),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [int(n) for n in out.stdout.split()[-len(HELD_OUT) :]]


def test_the_answers_warm_the_parser_for_answers_it_has_not_seen():
    # ANTLR's prediction cache holds the lookahead of the warm-up's answers, which answers of
    # other problems share: each item's fork computes less of it again.
    full, cases_only = _fork_counts("full"), _fork_counts("cases only")
    assert sum(full) < 0.9 * sum(cases_only), (full, cases_only)
    assert _fork_counts("full") == full  # and the same in every fresh interpreter


@pytest.mark.slow  # four pools, two of them spawned (each warms itself up)
def test_forkserver_and_spawned_workers_put_the_budget_edge_at_the_same_call():
    # A spawned worker runs the warm-up itself, a forkserver's worker inherits it: the same
    # state, so the same item makes the same calls and flips to `timeout` at the same budget.
    (text, gold), calls = HELD_OUT[1], _fork_counts("full")[1]
    for method in ("forkserver", "spawn"):
        for budget, timed_out in ((calls, False), (calls - 1, True)):
            cfg = dataclasses.replace(CFG, start_method=method, max_work_calls=budget)
            with RewardPool(cfg) as pool:
                (verdict,) = pool.score([text], [gold])
            assert (verdict.status == "timeout") == timed_out, (method, budget, verdict)
