"""dynamo_jax/step/optimizer.py: the global-norm clip that takes the caller's norm.

Oracle: `optax.clip_by_global_norm` itself, on the same updates, bit for bit, clipped or not,
with the norm computed by the transformation or passed in; and the whole optimizer against
optax's own chain of clip and AdamW.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dynamo_jax.config import OptimConfig
from dynamo_jax.step.optimizer import clip_by_global_norm, make_optimizer


def _tree(scale: float):
    key = jax.random.key(0)
    return {
        "a": scale * jax.random.normal(key, (7, 5)),
        "b": {"c": scale * jax.random.normal(jax.random.fold_in(key, 1), (11,))},
    }


def _bits(tree):
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("scale", [0.01, 10.0])  # under and over the norm of 1
@pytest.mark.parametrize("given", [False, True])
def test_the_clip_has_optaxs_bits_with_its_own_norm_or_the_callers(scale, given):
    updates = _tree(scale)
    # the norm computed in the same program, as the train step does
    extra = lambda u: {"grad_norm": optax.tree.norm(u)} if given else {}
    ours = jax.jit(lambda u: clip_by_global_norm(1.0).update(u, optax.EmptyState(), **extra(u)))
    theirs = jax.jit(lambda u: optax.clip_by_global_norm(1.0).update(u, optax.EmptyState()))
    (clipped, state), (expected, _) = ours(updates), theirs(updates)
    assert _bits(clipped) == _bits(expected)
    assert state == optax.EmptyState()
    assert (_bits(clipped) == _bits(updates)) == (scale == 0.01)


def test_the_clip_uses_the_norm_it_is_given():
    updates = _tree(1.0)
    clipped, _ = clip_by_global_norm(1.0).update(
        updates, optax.EmptyState(), grad_norm=jnp.float32(4.0)
    )
    np.testing.assert_array_equal(clipped["a"], updates["a"] / jnp.float32(4.0))


def test_the_optimizer_is_optaxs_clip_and_adamw_state_and_bits():
    cfg = OptimConfig(learning_rate=1e-2, max_grad_norm=1.0, warmup_steps=0)
    ours = make_optimizer(cfg, total_updates=10)
    theirs = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(1e-2, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay),
    )
    params, grads = _tree(1.0), _tree(10.0)
    state_ours, state_theirs = ours.init(params), theirs.init(params)
    assert jax.tree.structure(state_ours) == jax.tree.structure(state_theirs)  # checkpoints
    step_ours = jax.jit(lambda s: ours.update(grads, s, params, grad_norm=optax.tree.norm(grads)))
    step_theirs = jax.jit(lambda s: theirs.update(grads, s, params))
    for _ in range(2):
        (u_ours, state_ours), (u_theirs, state_theirs) = (
            step_ours(state_ours),
            step_theirs(state_theirs),
        )
        assert _bits((u_ours, state_ours)) == _bits((u_theirs, state_theirs))
