"""The step's metrics line: rewards over every generated group, responses over the trained
batch, the log-prob metrics as given; hand-worked numbers."""

import numpy as np

from dynamo_jax.allocation import AllocationResult
from dynamo_jax.loop import assemble, report
from dynamo_jax.loop.assemble import RolloutBatch
from dynamo_jax.loop.generate import Drawn, Rollouts
from dynamo_jax.loop.report import RunCounts, UpdateResult, step_metrics
from dynamo_jax.rollout.protocol import Completion


def _batch(completions, rewards, rows=4):
    arrays = assemble.pack_rollouts({1: (5, 6), 2: (7,)}, completions, rows=rows, seq_len=6)
    padded = np.zeros(rows, np.float32)
    padded[: len(rewards)] = rewards
    entropy = np.full((rows, 6), 0.5, np.float32)
    return RolloutBatch(**arrays, rewards=padded, advantages=np.zeros(rows, np.float32),
                        temperature=0.9, old_logp=np.zeros((rows, 6), np.float32),
                        entropy=entropy)  # fmt: skip


def _completion(pid, n_tokens, reason="stop"):
    return Completion(
        pid, 0, np.ones(n_tokens, np.int32), np.zeros(n_tokens, np.float32), reason, 0
    )


def _metrics(batch, groups, rewards):
    allocation = AllocationResult(np.array([2, 2]), 0, {})
    rollouts = Rollouts(np.array([0, 1]), False, allocation, [], 0.9)
    drawn = Drawn([(np.array([0, 1]), False, groups)], rewards, {"reward/correct_share": 0.25})
    return step_metrics(
        16,
        rollouts,
        drawn,
        batch,
        {"rollout/engine_logp_abs_diff": 0.125, "rollout/staleness": 1},
        UpdateResult(
            [{"loss": 1.0, "update_norm": 2.0}, {"loss": 3.0, "update_norm": 2.0}], [False, True]
        ),
        {"time/step": 2.0},
        RunCounts(consecutive_nonfinite=1, applied_updates=7, epochs_completed=3),
    )


def test_rewards_describe_every_generated_group_and_responses_the_trained_batch():
    # Generated: prompt 1 twice (rewards 1, 0) and prompt 2 twice (0, 0); reward mean 1/4,
    # per-prompt means 1/2 and 0 → 1/4, one of two groups has no variance. Trained: prompt 1's two
    # responses of 2 and 3 tokens, one stopped.
    groups = assemble.group_stats(
        np.array([1, 1, 2, 2]), np.array([1, 0, 0, 0], np.float32), np.ones(4, bool)
    )
    batch = _batch([_completion(1, 2), _completion(1, 3, "length")], [1, 0])
    m = _metrics(batch, groups, np.array([1, 0, 0, 0], np.float32))
    assert m["reward/mean"] == 0.25 and m["reward/prompt_mean"] == 0.25
    assert m["reward/zero_var_groups"] == 0.5 and m["reward/prompts_with_signal"] == 1
    assert m["response/len_mean"] == 2.5 and m["response/stop_share"] == 0.5
    assert m["perf/response_tokens"] == 5 and m["perf/tokens_per_s"] == 2.5
    assert m["loss/loss"] == 2.0 and m["nonfinite/skipped_in_step"] == 1
    assert m["rollout/engine_logp_abs_diff"] == 0.125 and m["rollout/staleness"] == 1
    assert m["alloc/n_hist"][2] == 2 and m["temperature"] == 0.9 and m["entropy/mean"] == 0.5


def test_a_batch_without_rows_reports_zeros_not_nan():
    """Dynamic sampling at its round limit may keep no group: the batch is all padding."""
    groups = assemble.group_stats(np.array([1, 1]), np.array([0, 0], np.float32), np.ones(2, bool))
    m = _metrics(_batch([], []), groups, np.zeros(2, np.float32))
    assert m["response/len_mean"] == 0.0 and m["response/stop_share"] == 0.0
    assert m["perf/response_tokens"] == 0 and m["reward/zero_var_groups"] == 1.0


def test_moved_share_is_the_share_of_rollouts_away_from_uniform():
    assert report.moved_share(np.array([8, 8, 8])) == 0.0  # GRPO: nothing moved
    # n̄ = 4 of 16 rollouts: prompts 3 and 4 took 2 each from prompts 1 and 2 → 4/16
    assert report.moved_share(np.array([2, 2, 6, 6])) == 0.25
    assert report.moved_share(np.array([0, 16])) == 0.5  # half the prompts got everything
    assert report.moved_share(np.array([0, 0])) == 0.0
