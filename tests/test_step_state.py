"""dynamo_jax/step/state.py: a random training state made in one program.

Oracle: the state built step by step the way it was before it became one program (the key
made eagerly, `init_params`, then `train_state_from_params`: a copy and the optimizer's own
init), compared bit for bit; a program count from jax.monitoring's compile events.
"""

import jax
import numpy as np
import optax
from helpers.scripts import load_script

from dynamo_jax.models.presets import get_preset
from dynamo_jax.models.qwen import init_params
from dynamo_jax.sharding.mesh import MeshConfig, build_mesh
from dynamo_jax.sharding.rules import DEFAULT_RULES
from dynamo_jax.step.state import init_train_state, train_state_from_params, train_state_shardings

ct = load_script("benchmarks/compile_time.py")


def _bits(tree):
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


def test_a_random_state_from_a_seed_is_one_program_with_the_step_by_step_bits():
    cfg = get_preset("tiny-qwen3", vocab_size=32, scan_layers=False)
    optimizer = optax.adamw(optax.linear_schedule(1e-3, 0.0, 10), weight_decay=0.01)
    mesh = build_mesh(MeshConfig(shape=(1, 1, 1)), jax.devices()[:1])
    # first: its eager optax placeholder init compiles outside the count
    shardings = train_state_shardings(cfg, optimizer, mesh, DEFAULT_RULES)
    with ct.CompileLog() as log:
        state = init_train_state(cfg, optimizer, mesh, DEFAULT_RULES, 7)
    assert [c.name for c in log.compiled] == ["jit(fresh_state)"]
    params = init_params(cfg, jax.random.key(7), shardings=shardings.params)
    stepwise = train_state_from_params(params, optimizer, shardings)
    assert _bits(state) == _bits(stepwise)
    from_key = init_train_state(cfg, optimizer, mesh, DEFAULT_RULES, jax.random.key(7))
    assert _bits(from_key) == _bits(state)
    assert jax.tree.map(lambda x: x.sharding, state) == shardings
