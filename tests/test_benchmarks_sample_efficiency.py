"""benchmarks/sample_efficiency.py's run order, seed selection and argument checks.

Oracles: the (method, seed) lists written out by hand; the argument errors are checked in a
subprocess that stops before any run starts (parser.error exits 2 before JAX is loaded).
"""

import subprocess
import sys
from pathlib import Path

from benchmarks import sample_efficiency as se

ROOT = Path(__file__).resolve().parents[1]


def test_run_order_is_seed_major_with_the_given_seeds():
    methods = ["grpo", "dynamo@prompt-mean"]
    assert se.run_order(methods, [2, 3, 4]) == [
        ("grpo", 2),
        ("dynamo@prompt-mean", 2),
        ("grpo", 3),
        ("dynamo@prompt-mean", 3),
        ("grpo", 4),
        ("dynamo@prompt-mean", 4),
    ]


def test_steps_to_target_uses_the_trailing_five_step_mean():
    # Sums of the full windows (exact in binary): steps 5, 6, 7 -> 1.5, 2.5, 3.25; means 0.3,
    # 0.5, 0.65 (division by 5 rounds to the same doubles as those literals).
    rewards = [0.0, 0.25, 0.25, 0.5, 0.5, 1.0, 1.0]
    assert se.steps_to_target(rewards, 0.3) == 5
    assert se.steps_to_target(rewards, 0.5) == 6
    assert se.steps_to_target(rewards, 0.65) == 7
    assert se.steps_to_target(rewards, 0.66) is None
    # Fewer than five steps never count, however high the reward.
    assert se.steps_to_target([1.0] * 4, 0.9) is None


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.sample_efficiency", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_baseline_must_be_among_the_methods():
    res = _run("--methods", "grpo@prompt-mean,dynamo@prompt-mean")
    assert res.returncode == 2
    assert "--methods must include the baseline grpo" in res.stderr


def test_negative_seed_offset_and_zero_seeds_are_refused():
    for args in (["--seed_offset", "-1"], ["--seeds", "0"]):
        res = _run(*args)
        assert res.returncode == 2, args
        assert "--seeds must be >= 1 and --seed_offset >= 0" in res.stderr
