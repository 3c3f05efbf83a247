"""loop/assemble.py: the batch's advantages come from one compiled program, equal to the formula."""

import numpy as np
import pytest

from dynamo_jax.loop import assemble
from dynamo_jax.losses.advantages import sequence_advantages
from dynamo_jax.losses.config import LossConfig


@pytest.mark.parametrize("variant", ["grpo", "dynamo", "w_reinforce"])
def test_jitted_advantages_equal_the_eager_ones_bit_for_bit(variant):
    cfg = LossConfig.preset(variant)
    rng = np.random.default_rng(1)
    for _ in range(3):
        rewards = (rng.random(128) * (rng.random(128) < 0.5)).astype(np.float32)
        groups = rng.integers(0, 16, 128) * 7919  # stable ids, not positions
        valid = rng.random(128) < 0.9
        eager = sequence_advantages(cfg, rewards, groups, num_groups=16, valid_B=valid)
        jitted = assemble._sequence_advantages(cfg, rewards, groups, num_groups=16, valid_B=valid)
        assert np.abs(np.asarray(eager)).max() > 0.1  # a batch with signal
        np.testing.assert_array_equal(np.asarray(jitted), np.asarray(eager))
