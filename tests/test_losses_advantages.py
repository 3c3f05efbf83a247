"""GRPO advantages by prompt id with variable group sizes, and W-REINFORCE, vs the reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_losses as ref
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamo_jax.losses import LossConfig, grpo_advantages, sequence_advantages

_jit_adv = jax.jit(grpo_advantages, static_argnames=("norm_adv_by_std", "num_groups"))


@pytest.mark.parametrize("norm", [True, False])
def test_variable_groups_by_id_not_position(norm):
    # ids 907, 3, 55, 12 interleaved; sizes 4, 1 (lone), 3 (all equal), 2
    ids = np.array([907, 3, 55, 907, 12, 55, 907, 55, 12, 907])
    rewards = np.array([1, 1, 0, 0, 1, 0, 1, 0, 0, 1], np.float32)
    got = _jit_adv(rewards, ids, norm_adv_by_std=norm, num_groups=8)
    want = ref.grpo_advantages(rewards, ids, norm_adv_by_std=norm)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert float(got[1]) == 0.0  # lone response
    assert np.all(np.asarray(got)[[2, 5, 7]] == 0.0)  # all-equal group
    # permuting the batch permutes the advantages: groups follow ids, not positions
    perm = np.random.default_rng(0).permutation(len(ids))
    np.testing.assert_allclose(_jit_adv(rewards[perm], ids[perm], norm_adv_by_std=norm, num_groups=8),
                               np.asarray(got)[perm], rtol=1e-6)  # fmt: skip


@settings(deadline=None, max_examples=25)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.floats(0, 1, allow_nan=False)), min_size=1, max_size=16
    )
)
def test_random_groups_match_reference(rows):
    ids = np.array([r[0] for r in rows])
    rewards = np.array([r[1] for r in rows], np.float32)
    padded_ids = np.pad(ids, (0, 16 - len(ids)))
    padded_r = np.pad(rewards, (0, 16 - len(ids)))
    valid = np.arange(16) < len(ids)
    got = _jit_adv(padded_r, padded_ids, valid_B=valid, num_groups=6)
    want = ref.grpo_advantages(rewards, ids)
    np.testing.assert_allclose(np.asarray(got)[: len(ids)], want, rtol=1e-4, atol=1e-5)
    assert np.all(np.asarray(got)[len(ids) :] == 0.0)


@pytest.mark.parametrize("value", [0.7875689217203012, 0.1, 1e3 / 3])
def test_equal_continuous_rewards_give_exactly_zero(value):
    """A float32 group mean of equal non-binary rewards is not the reward itself (rounding);
    divided by std + ε that rounding once made an advantage of 0.056. It must be exactly 0, and
    a group one float32 ulp apart must match the float64 reference."""
    ids = np.array([0, 0, 0, 1, 1, 1, 1])
    rewards = np.full(7, value, np.float32)
    rewards[5] = np.nextafter(rewards[5], np.float32(2 * value))
    got = np.asarray(_jit_adv(rewards, ids, num_groups=2))
    assert np.all(got[:3] == 0.0)
    np.testing.assert_allclose(got, ref.grpo_advantages(rewards, ids), rtol=1e-4, atol=1e-5)


def test_w_reinforce_weights_and_dispatch():
    cfg = LossConfig.preset("w_reinforce")
    adv = sequence_advantages(cfg, jnp.array([1.0, 0.0, 1.0]), jnp.array([0, 0, 1]))
    np.testing.assert_allclose(adv, [0.1, -1.0, 0.1])
    grpo = sequence_advantages(LossConfig.preset("grpo"), jnp.array([1.0, 0.0]), jnp.array([4, 4]))
    np.testing.assert_allclose(grpo, ref.grpo_advantages([1.0, 0.0], [4, 4]), rtol=1e-5)
