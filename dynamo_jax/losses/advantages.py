"""Sequence-level advantages: GRPO with variable group sizes (docs/algorithm.md#grpo-advantages) and W-REINFORCE.

Groups are formed by the prompt's stable id, never by position: responses of one prompt may
sit anywhere in the batch and each prompt may have its own number of responses n_i.
Everything is jittable: ids are densified with a fixed-size `jnp.unique`, so the number of
groups is static (`num_groups`, default B = an upper bound).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import ops

from dynamo_jax.losses import registry
from dynamo_jax.losses.config import LossConfig


def _dense_group_index(group_ids_B, valid_B, num_groups):
    """Map arbitrary prompt ids to 0..G−1; invalid rows go to an extra dump segment G."""
    ids = jnp.asarray(group_ids_B)
    # Invalid rows take the id of some valid row so they never create a group of their own.
    fill = jnp.where(valid_B.any(), ids[jnp.argmax(valid_B)], ids[0])
    ids = jnp.where(valid_B, ids, fill)
    _, inverse = jnp.unique(ids, return_inverse=True, size=num_groups, fill_value=fill)
    return jnp.where(valid_B, inverse.reshape(-1), num_groups)


def grpo_advantages(
    rewards_B,
    group_ids_B,
    *,
    norm_adv_by_std: bool = True,
    eps: float = 1e-6,
    num_groups: int | None = None,
    valid_B=None,
):
    """A_ij = (R_ij − mean_i) / (std_i + ε) per prompt-id group; float32 [B].

    std is the unbiased sample std; `norm_adv_by_std=False` gives Dr.GRPO's R − mean. A group
    of one response gets 0. `valid_B` (bool) excludes padding rows (their advantage is 0).
    `num_groups` must be ≥ the number of distinct ids among valid rows (default: B).
    """
    rewards_B = jnp.asarray(rewards_B, jnp.float32)
    s = rewards_B.shape[0]
    valid_B = jnp.ones((s,), bool) if valid_B is None else jnp.asarray(valid_B, bool)
    num_groups = s if num_groups is None else int(num_groups)
    if num_groups < 1:
        raise ValueError(f"grpo_advantages: num_groups must be >= 1, got {num_groups}")
    seg_B = _dense_group_index(group_ids_B, valid_B, num_groups)
    nseg = num_groups + 1
    r_B = jnp.where(valid_B, rewards_B, 0.0)
    # Per prompt group: [I + 1] (segment 0 holds the invalid rows).
    count_I = ops.segment_sum(valid_B.astype(jnp.float32), seg_B, nseg)
    # Centre on each group's max first: R − max is exact in float32 (Sterbenz) for rewards within
    # a factor of 2, so the mean's rounding error scales with the group's spread, not with |R|.
    # A group of equal rewards then gets exactly 0 (a float32 mean of three 0.78756892s is not
    # 0.78756892, and dividing that rounding by std + ε made an advantage of 0.056 from nothing).
    max_I = ops.segment_max(jnp.where(valid_B, r_B, -jnp.inf), seg_B, nseg)
    d_B = jnp.where(valid_B, r_B - max_I[seg_B], 0.0)
    mean_d_I = ops.segment_sum(d_B, seg_B, nseg) / jnp.maximum(count_I, 1.0)
    centred_B = jnp.where(valid_B, d_B - mean_d_I[seg_B], 0.0)
    if norm_adv_by_std:
        var_I = ops.segment_sum(centred_B**2, seg_B, nseg) / jnp.maximum(count_I - 1.0, 1.0)
        adv_B = centred_B / (jnp.sqrt(var_I)[seg_B] + eps)
    else:
        adv_B = centred_B
    # A lone response has no group to compare with: its advantage is 0 (centred_B is 0 already,
    # the explicit mask documents it and guards the std branch).
    return jnp.where(valid_B & (count_I[seg_B] > 1.0), adv_B, 0.0)


def w_reinforce_advantages(rewards_B, *, lam: float = 0.1, valid_B=None):
    """W-REINFORCE (Zhu et al. 2025): +λ for correct (R > 0) responses, −1 for incorrect."""
    rewards_B = jnp.asarray(rewards_B, jnp.float32)
    adv_B = jnp.where(rewards_B > 0, jnp.float32(lam), jnp.float32(-1.0))
    return adv_B if valid_B is None else jnp.where(valid_B, adv_B, 0.0)


def sequence_advantages(cfg: LossConfig, rewards_B, group_ids_B, *, num_groups=None, valid_B=None):
    """The sequence advantages of the configured variant (GRPO unless it defines its own)."""
    variant = registry.get(cfg.variant)
    if variant.sequence_advantages is not None:
        return variant.sequence_advantages(cfg, rewards_B, group_ids_B, num_groups, valid_B)
    return grpo_advantages(
        rewards_B, group_ids_B, norm_adv_by_std=cfg.norm_adv_by_std, num_groups=num_groups,
        valid_B=valid_B,
    )  # fmt: skip
