"""PromptHistory: scatter updates, decay, epoch accumulators, per-prompt entropy, checkpoint round
trip (including a state saved before the entropy existed), bad input."""

import numpy as np
import pytest

from dynamo_jax.allocation import PromptHistory


def test_update_accumulates_per_prompt():
    h = PromptHistory(6)
    h.update(np.array([4, 1]), n_generated=[8, 4], n_correct=[3, 0], reward_sum=[3.0, 0.5])
    h.update(np.array([1, 2]), n_generated=[2, 6], n_correct=[2, 6], reward_sum=[2.0, 6.0])
    np.testing.assert_array_equal(h.generated, [0, 6, 6, 0, 8, 0])
    np.testing.assert_array_equal(h.correct, [0, 2, 6, 0, 3, 0])
    np.testing.assert_array_equal(h.total_generated, [0, 6, 6, 0, 8, 0])
    np.testing.assert_allclose(h.total_reward, [0, 2.5, 6, 0, 3, 0])
    np.testing.assert_array_equal(h.visits, [0, 2, 1, 0, 1, 0])


def test_decay_scales_old_counts_of_updated_prompts_only():
    h = PromptHistory(3, decay=0.5)
    h.update(np.array([0, 1]), [8, 4], [4, 2], [4.0, 2.0])
    h.update(np.array([0]), [2], [2], [2.0])
    # prompt 0: G = 0.5·8 + 2 = 6, k = 0.5·4 + 2 = 4; prompt 1 untouched by the second step.
    np.testing.assert_allclose(h.generated, [6.0, 4.0, 0.0])
    np.testing.assert_allclose(h.correct, [4.0, 2.0, 0.0])
    np.testing.assert_array_equal(h.total_generated, [10, 4, 0])  # totals never decay


def test_above_batch_mean_default_for_binary_rewards():
    h = PromptHistory(3)
    h.update(np.array([0, 1]), [4, 4], [1, 4], [1.0, 4.0])  # batch mean 5/8 < 1
    np.testing.assert_array_equal(h.epoch_above_mean, [1, 4, 0])
    h.update(np.array([2]), [3], [3], [3.0])  # all correct: nothing beats the mean of 1
    np.testing.assert_array_equal(h.epoch_above_mean, [1, 4, 0])
    h.update(np.array([2]), [3], [1], [1.0], n_above_batch_mean=[2])  # explicit count wins
    np.testing.assert_array_equal(h.epoch_above_mean, [1, 4, 2])
    h.end_epoch()
    assert h.epochs_completed == 1
    np.testing.assert_array_equal(h.epoch_above_mean, [0, 0, 0])
    np.testing.assert_array_equal(h.epoch_generated, [0, 0, 0])
    np.testing.assert_array_equal(h.total_generated, [4, 4, 6])


def test_state_dict_round_trip_is_exact_and_independent():
    h = PromptHistory(5, decay=0.9)
    h.update(np.array([0, 3]), [4, 6], [1, 5], [1.0, 5.0])
    h.end_epoch()
    h.update(np.array([3]), [2], [1], [1.0])
    h.e3_rank[:] = [0.2, 0.4, 0.6, 0.8, 1.0]
    state = h.state_dict()
    h2 = PromptHistory.from_state_dict(state, decay=0.9, num_prompts=5)
    for key, value in h2.state_dict().items():
        np.testing.assert_array_equal(value, state[key], err_msg=key)
        assert value.dtype == state[key].dtype, key
    assert h2.epochs_completed == 1
    state["generated"][0] = 99.0  # the restored history owns its arrays
    assert h2.generated[0] != 99.0


def test_entropy_mean_keeps_the_latest_value_per_prompt():
    h = PromptHistory(4)
    assert np.isnan(h.entropy_mean).all()  # nothing recorded yet
    h.update(np.array([0, 2]), [4, 4], [1, 2], [1.0, 2.0])  # no entropy passed: unchanged
    assert np.isnan(h.entropy_mean).all()
    h.update(np.array([2, 0]), [4, 4], [1, 2], [1.0, 2.0], entropy_mean=[0.7, 1.5])
    np.testing.assert_array_equal(h.entropy_mean, [1.5, np.nan, 0.7, np.nan])
    # the latest replaces (not a running mean); NaN = none this step, the old value stays
    h.update(np.array([0, 2, 3]), [2, 2, 2], [0, 0, 0], [0, 0, 0], entropy_mean=[0.2, np.nan, 0])
    np.testing.assert_array_equal(h.entropy_mean, [0.2, np.nan, 0.7, 0.0])


def test_state_saved_before_entropy_existed_still_loads():
    h = PromptHistory(3)
    h.update(np.array([1]), [4], [3], [3.0], entropy_mean=[0.9])
    old = {k: v for k, v in h.state_dict().items() if k != "entropy_mean"}
    restored = PromptHistory.from_state_dict(old, num_prompts=3)
    np.testing.assert_array_equal(restored.generated, [0, 4, 0])
    assert np.isnan(restored.entropy_mean).all()  # as if no entropy had been recorded
    again = PromptHistory.from_state_dict(h.state_dict(), num_prompts=3)
    np.testing.assert_array_equal(again.entropy_mean, [np.nan, 0.9, np.nan])


@pytest.mark.parametrize(
    "entropy, match",
    [
        ([0.5, -0.1], r"entropy_mean\[1\] \(prompt index 3\) = -0.1"),
        ([np.inf, 0.5], r"entropy_mean\[0\] \(prompt index 1\) = inf"),
        ([0.5], r"entropy_mean has shape \(1,\), expected \(2,\)"),
    ],
)
def test_update_rejects_bad_entropy(entropy, match):
    h = PromptHistory(5)
    with pytest.raises(ValueError, match=match):
        h.update(np.array([1, 3]), [2, 2], [1, 1], [1.0, 1.0], entropy_mean=entropy)
    np.testing.assert_array_equal(h.generated, np.zeros(5))  # nothing half-applied
    assert np.isnan(h.entropy_mean).all()


def test_from_state_dict_errors():
    state = PromptHistory(4).state_dict()
    with pytest.raises(ValueError, match="holds 4 prompts but the dataset has 5"):
        PromptHistory.from_state_dict(state, num_prompts=5)
    bad = dict(state)
    del bad["visits"]
    with pytest.raises(ValueError, match="missing \\['visits'\\]"):
        PromptHistory.from_state_dict(bad)
    bad = dict(state)
    bad["correct"] = np.zeros(3)
    with pytest.raises(ValueError, match="'correct' has shape"):
        PromptHistory.from_state_dict(bad)


@pytest.mark.parametrize(
    "indices, gen, cor, rew, match",
    [
        ([0, 7], [1, 1], [0, 0], [0, 0], r"indices\[1\] = 7 is not a dense prompt index"),
        ([-1], [1], [0], [0], r"indices\[0\] = -1"),
        ([2, 2], [1, 1], [0, 0], [0, 0], "prompt index 2 appears 2 times"),
        ([0.5], [1], [0], [0], "integer array"),
        ([1, 2], [4, 4], [1, 5], [1, 5], r"row 1 \(prompt index 2\) has n_correct=5"),
        ([1], [-1], [0], [0], "n_correct=0, n_generated=-1"),
        ([1], [2.5], [0], [0], r"n_generated\[0\] = 2.5 is not an integer"),
        ([1], [2], [1], [float("nan")], r"reward_sum\[0\] = nan is not finite"),
        ([1, 2], [2], [1], [1], r"n_generated has shape \(1,\), expected \(2,\)"),
    ],
)
def test_update_rejects_bad_rows(indices, gen, cor, rew, match):
    h = PromptHistory(5)
    with pytest.raises(ValueError, match=match):
        h.update(np.array(indices), gen, cor, rew)
    np.testing.assert_array_equal(h.generated, np.zeros(5))  # nothing half-applied


def test_scale_update_of_many_prompts_is_vectorised():
    # 200k prompts: one step touching 4096 of them is a few scatter-adds.
    h = PromptHistory(200_000)
    rng = np.random.default_rng(0)
    idx = rng.choice(200_000, size=4096, replace=False)
    gen = rng.integers(1, 17, size=4096)
    cor = rng.integers(0, gen + 1)
    h.update(idx, gen, cor, cor.astype(float))
    assert h.total_generated.sum() == gen.sum()
    assert h.correct[idx].sum() == cor.sum()
