"""Dynamic sampling's group selection and round loop, with hand-worked expected values."""

import numpy as np
import pytest

from dynamo_jax.allocation import AllocationResult
from dynamo_jax.loop import dynamic_sampling as ds
from dynamo_jax.rollout.pipeline import BatchPlan
from dynamo_jax.rollout.protocol import Completion, Request, SamplingParams


def _round(groups, epoch_end=False):
    """A round from [(prompt_id, rewards), ...] (one request per group, in order)."""
    completions, rewards = [], []
    for pid, rs in groups:
        for i, r in enumerate(rs):
            completions.append(Completion(pid, i, np.array([1], np.int32), np.zeros(1), "stop", 0))
            rewards.append(r)
    plan = BatchPlan(
        step=1,
        rows=np.arange(len(groups), dtype=np.int64),
        epoch_end=epoch_end,
        allocation=AllocationResult(np.array([len(rs) for _, rs in groups]), 0, {}),
        requests=tuple(Request(pid, (1,), len(rs)) for pid, rs in groups),
        sampling=SamplingParams(max_new_tokens=1),
        version=0,
    )
    n = len(completions)
    shares = {"reward/correct_share": float(np.mean(rewards)) if n else 0.0}
    return ds.Round(plan, completions, np.asarray(rewards, np.float32), shares)


def test_group_slices_are_runs_of_equal_prompt_ids():
    assert ds.group_slices([7, 7, 9, 9, 9, 4]) == [(0, 2), (2, 5), (5, 6)]
    assert ds.group_slices([]) == []


def test_selection_keeps_whole_groups_with_a_signal_that_fit_once_each():
    # Round 0: A (1, 0) signal, B (0, 0) none, C (1, 1, 0, 0) signal.
    # Round 1: D (1, 0, 1) signal, A again (0, 1) signal, E (1, 0, 0, 0) signal.
    # rows 10, 4 groups at most: A → 2 rows, C → 6, D → 9; A again: repeated; E (4 rows): 13 > 10,
    # does not fit. With signal: A, C, D, A, E = 5.
    r0 = _round([(1, [1, 0]), (2, [0, 0]), (3, [1, 1, 0, 0])])
    r1 = _round([(4, [1, 0, 1]), (1, [0, 1]), (5, [1, 0, 0, 0])])
    sel = ds.select_groups([r0, r1], max_groups=4, rows=10)
    assert sel.groups == ((0, 0, 2), (0, 4, 8), (1, 0, 3))
    assert (sel.rows, sel.with_signal, sel.not_fitting, sel.repeated) == (9, 5, 1, 1)
    completions, rewards = ds.trained([r0, r1], sel)
    assert [c.prompt_id for c in completions] == [1, 1, 3, 3, 3, 3, 4, 4, 4]
    np.testing.assert_array_equal(rewards, [1, 0, 1, 1, 0, 0, 1, 0, 1])
    # Two groups at most: A and C; D, A, E have a signal but the batch is full of groups.
    sel = ds.select_groups([r0, r1], max_groups=2, rows=10)
    assert sel.groups == ((0, 0, 2), (0, 4, 8)) and (sel.not_fitting, sel.repeated) == (0, 0)


def test_rounds_stop_when_the_batch_is_full_or_at_the_limit():
    # N = 2 groups of 2 rows (B = 4). Round 0 has one group with a signal; round 1 another.
    rounds = {1: _round([(3, [1, 0]), (4, [0, 0])]), 2: _round([(5, [1, 0]), (6, [1, 0])])}
    drawn = []

    def draw(r):
        drawn.append(r)
        return rounds[r]

    first = _round([(1, [1, 0]), (2, [1, 1])])
    got, sel = ds.sample_rounds(first, draw, max_groups=2, rows=4, max_rounds=10)
    assert drawn == [1] and len(got) == 2 and sel.groups == ((0, 0, 2), (1, 0, 2))
    m = ds.metrics(got, sel, max_groups=2, rows=4, max_rounds=10)
    # 4 prompts generated for 2 kept; 8 rollouts.
    assert m == {
        "dynamic/rounds": 2,
        "dynamic/prompts_generated": 4,
        "dynamic/rollouts_generated": 8,
        "dynamic/kept_groups": 2,
        "dynamic/prompts_per_kept": 2.0,
        "dynamic/groups_with_signal": 2,
        "dynamic/not_fitting": 0,
        "dynamic/repeated": 0,
        "dynamic/round_limit_hit": 0,
    }
    # No signal anywhere: every allowed round is drawn, and the limit is reported.
    drawn.clear()
    flat = _round([(7, [0, 0]), (8, [1, 1])])
    got, sel = ds.sample_rounds(flat, lambda r: drawn.append(r) or flat, max_groups=2, rows=4,
                                max_rounds=3)  # fmt: skip
    assert drawn == [1, 2] and sel.groups == ()
    m = ds.metrics(got, sel, max_groups=2, rows=4, max_rounds=3)
    assert m["dynamic/round_limit_hit"] == 1 and m["dynamic/prompts_per_kept"] == 6.0


def test_verdict_shares_weight_rounds_by_their_completions():
    # 2 completions at share 0.5 and 4 at share 0.25: (0.5·2 + 0.25·4) / 6 = 1/3.
    r0 = _round([(1, [1, 0])])
    r1 = _round([(2, [1, 0, 0, 0])])
    assert ds.verdict_shares([r0, r1])["reward/correct_share"] == pytest.approx(1 / 3)
