"""`TrainState` (params, optimizer state, step) and its shardings, created without host copies.

`init_train_state` creates random parameters and the optimizer state directly in their sharded
layout (one jit with out_shardings), so a 7B model is never materialised on one device;
`train_state_from_params` places already-loaded parameters (e.g. imported from a Hugging Face
checkpoint) and initialises the optimizer state next to them.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from dynamo_jax.models.config import ModelConfig
from dynamo_jax.models.qwen import param_shapes, random_params
from dynamo_jax.sharding.rules import LogicalRules, opt_state_shardings, replicated
from dynamo_jax.step.forward import model_param_shardings


class TrainState(flax.struct.PyTreeNode):
    """Everything the optimizer step updates. `step` counts APPLIED updates (skips excluded)."""

    params: Any
    opt_state: Any
    step: jax.Array


def abstract_train_state(
    model_cfg: ModelConfig, optimizer: optax.GradientTransformation
) -> TrainState:
    """The state as ShapeDtypeStructs (no allocation)."""
    params = param_shapes(model_cfg)
    opt_state = jax.eval_shape(optimizer.init, params)
    return TrainState(params=params, opt_state=opt_state, step=jax.ShapeDtypeStruct((), jnp.int32))


def train_state_shardings(
    model_cfg: ModelConfig,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    rules: LogicalRules,
) -> TrainState:
    """A TrainState of NamedShardings: params from the rules, optimizer moments like their params."""
    abstract = abstract_train_state(model_cfg, optimizer)
    params = model_param_shardings(model_cfg, mesh, rules)
    return TrainState(
        params=params,
        opt_state=opt_state_shardings(optimizer, abstract.opt_state, params, mesh),
        step=replicated(mesh),
    )


def init_train_state(
    model_cfg: ModelConfig,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    rules: LogicalRules,
    rng: jax.Array | int,
) -> TrainState:
    """Random parameters and a fresh optimizer state, each leaf created in its sharded layout,
    from `rng`: a key, or a seed (the key is then made inside the program).

    One program makes the whole state (the key, the parameters, the optimizer state, the step
    counter): separately they were four or five programs to compile, the same bits."""
    shardings = train_state_shardings(model_cfg, optimizer, mesh, rules)

    def fresh_state(key: jax.Array) -> TrainState:
        key = jax.random.key(key) if isinstance(rng, (int, np.integer)) else key
        params = random_params(model_cfg, key)
        step = jnp.zeros((), jnp.int32)
        return TrainState(params=params, opt_state=optimizer.init(params), step=step)

    return jax.jit(fresh_state, out_shardings=shardings)(rng)


def train_state_from_params(
    params: Any, optimizer: optax.GradientTransformation, shardings: TrainState
) -> TrainState:
    """A step-0 TrainState holding a copy of `params` laid out as `shardings.params`.

    A copy (never an alias), so donating the state to the train step leaves `params` usable.
    """
    # device_put may reuse the caller's buffers (even with may_alias=False when a replicated
    # leaf already sits on one of the devices); a jitted copy never aliases its inputs.
    placed = jax.device_put(params, shardings.params)
    params = jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=shardings.params)(placed)
    opt_state = jax.jit(optimizer.init, out_shardings=shardings.opt_state)(params)
    step = jax.device_put(jnp.zeros((), jnp.int32), shardings.step)
    return TrainState(params=params, opt_state=opt_state, step=step)
