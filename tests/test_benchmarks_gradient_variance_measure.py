"""The measurement's plan and allocations (benchmarks/gradient_variance_measure.py).

Oracles: hand-worked counts and water levels (arithmetic in the comments).
"""

import functools
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks import gradient_variance as gv
from benchmarks import gradient_variance_measure as gm
from benchmarks import gradient_variance_pipeline as gv_pipeline

CONFIG_OF = functools.partial(gv.tiny_config, "max", seed=0)  # dynamo: n_avg 8 in [2, 16]


def test_gradient_plan_counts_each_kind():
    args = SimpleNamespace(reference=2, reference_n=64, sigma_draws=4, draws=5)
    args.allocations = ["uniform", "dynamo", "oracle_sigma"]
    plan = gm.GradientPlan.of(args, 8, 8)
    # reference 2 x 8*64 = 1024; sigma 8*4 = 32 x 8 = 256; draws 3*5 = 15 x 64 = 960
    assert plan.kinds == ((2, (8, 64)), (32, (1, 8)), (15, (8, 8)))
    assert plan.rows == 1024 + 256 + 960
    assert str(plan).startswith("49 gradient computations: reference 2 x 512 completions")


def test_progress_estimates_each_kind_at_its_own_shapes_seconds():
    args = SimpleNamespace(reference=0, reference_n=64, sigma_draws=2, draws=3)
    args.allocations = ["uniform", "dynamo"]
    plan = gm.GradientPlan.of(args, 2, 4)  # sigma 4 x (1, 4), draws 6 x (2, 4)
    clock = gv_pipeline.GradientClock()
    progress = gm.Progress(plan, SimpleNamespace(clock=clock))
    clock.tick((1, 4), 4, 9.0)  # compiles
    clock.tick((1, 4), 4, 1.0)
    clock.sampled(0.8)  # 0.1 s per completion over the 8
    # sigma: 2 left at 1 s + 4 x 0.1 s; draws not timed yet: 6 x (8 x 1/4 s + 8 x 0.1 s)
    assert progress.seconds_left() == pytest.approx(2 * 1.4 + 6 * (2.0 + 0.8))
    clock.tick((2, 4), 8, 7.0)  # compiles
    clock.tick((2, 4), 8, 3.0)
    # sampling now 0.8 s over 24 completions; sigma: 2 left at 1 s + 4 x 0.8 / 24 s; draws: 4
    # left at their own 3 s + 8 x 0.8 / 24 s
    assert progress.seconds_left() == pytest.approx(
        2 * (1.0 + 4 * 0.8 / 24) + 4 * (3.0 + 8 * 0.8 / 24)
    )


def test_oracle_allocation_is_alg1s_water_fill_of_sigma_in_dynamos_bounds():
    # sigma = [1, 2, 3, 0], budget 4 x 8 = 32: everyone starts at g_min 2, the other 24 are
    # poured as 24 sigma_i / 6 = [4, 8, 12, 0]: n = [6, 10, 14, 2].
    n = gm.oracle_allocation(CONFIG_OF, np.asarray([1.0, 4.0, 9.0, 0.0]), np.arange(4))
    np.testing.assert_array_equal(n, [6, 10, 14, 2])
    # sigma = [1, 1, 1, 9]: the pour 24 [1, 1, 1, 9] / 12 = [2, 2, 2, 18] stops prompt 3 at
    # g_max 16 (n = [4, 4, 4, 16]); the 4 left go 1 each, then the last unit to one of three.
    n = gm.oracle_allocation(CONFIG_OF, np.asarray([1.0, 1.0, 1.0, 81.0]), np.arange(4))
    assert n[3] == 16 and sorted(n[:3]) == [5, 5, 6]


def test_uniform_is_n_avg_each_and_dynamo_follows_the_history():
    rows = np.arange(4)
    # two rounds of 4 rollouts: prompt 0 always right, 1 never, 2 and 3 half right
    correct = np.asarray([4, 0, 2, 2])
    rounds = [
        {"row": rows, "count": np.full(4, 4), "correct": correct, "reward_sum": correct * 1.0,
         "entropy_mean": np.full(4, 0.5)}
        for _ in range(gm.WARMUP_ROUNDS)
    ]  # fmt: skip
    uniform = gm.allocation_of("uniform", CONFIG_OF, rounds, rows, 25)
    np.testing.assert_array_equal(uniform, [8, 8, 8, 8])
    dynamo = gm.allocation_of("dynamo", CONFIG_OF, rounds, rows, 25)
    assert dynamo.sum() == 32 and dynamo[2] == dynamo[3] > dynamo[0]
