"""Checkpoint round trips, retention, damaged-step fallback and the non-finite guard."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dynamo_jax.checkpoint import (
    CheckpointConfig,
    Checkpointer,
    NonFiniteStateError,
    abstract_like,
)


def _state(scale: float):
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "tensor"))
    w = jnp.arange(32, dtype=jnp.float32).reshape(4, 8) * scale
    w = jax.device_put(w, NamedSharding(mesh, P("data", "tensor")))
    return {
        "params": {"w": w, "b": jnp.full((3,), scale, jnp.bfloat16)},
        "opt": (jnp.zeros((2,)), {"count": jnp.int32(7)}),
        "rng": jax.random.key(3),
    }


def _host(step: int):
    return {
        "history": {"G": np.arange(5, dtype=np.int64) * step, "k": np.ones(5, np.float64) / 3},
        "data": {"epoch": 2, "position": step},
        "temperature": {"tau": 0.73, "h_init": np.float64(1.25)},
    }


def _tree_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        if jnp.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_keeps_values_dtypes_shardings_and_host_state(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(every_steps=1, max_to_keep=2))
    state = _state(1.5)
    ckpt.save(4, state=state, host=_host(4), meta={"config": {"lr": 1e-6}, "step": 4})
    got = ckpt.restore_latest(abstract_like(state))
    assert got.step == 4
    _tree_equal(got.state, state)
    assert got.state["params"]["b"].dtype == jnp.bfloat16
    assert got.state["params"]["w"].sharding == state["params"]["w"].sharding
    np.testing.assert_array_equal(got.host["history"]["G"], np.arange(5) * 4)
    assert got.host["history"]["k"].dtype == np.float64
    assert float(got.host["temperature"]["tau"]) == 0.73
    assert int(got.host["data"]["position"]) == 4
    assert got.meta == {"config": {"lr": 1e-6}, "step": 4}
    ckpt.close()


def test_max_to_keep_and_damaged_latest_falls_back_with_message(tmp_path, caplog):
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(every_steps=1, max_to_keep=2))
    for step in (1, 2, 3):
        ckpt.save(step, state=_state(float(step)), host=_host(step), meta={"step": step})
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3]
    # Damage every data file of the newest step's device state.
    for f in (tmp_path / "ck" / "3" / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING):
        got = ckpt.restore_latest(abstract_like(_state(0.0)))
    assert got.step == 2
    _tree_equal(got.state, _state(2.0))
    assert "step 3" in caplog.text and "damaged" in caplog.text
    ckpt.close()


def test_refuses_to_save_non_finite_state(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(every_steps=1, max_to_keep=2))
    state = _state(1.0)
    state["params"]["w"] = state["params"]["w"].at[0, 0].set(jnp.nan)
    with pytest.raises(NonFiniteStateError, match=r"\['params'\]\['w'\]"):
        ckpt.save(1, state=state, host=_host(1), meta={})
    assert ckpt.all_steps() == []
    assert ckpt.restore_latest(abstract_like(state)) is None
    ckpt.close()


def test_unfinished_temporary_step_is_ignored(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(every_steps=1, max_to_keep=3))
    ckpt.save(1, state=_state(1.0), host=_host(1), meta={})
    ckpt.close()
    # What a SIGKILL during a save leaves behind: an uncommitted temporary directory.
    (tmp_path / "ck" / "2.orbax-checkpoint-tmp-123").mkdir()
    again = Checkpointer(tmp_path / "ck", CheckpointConfig(every_steps=1, max_to_keep=3))
    assert again.all_steps() == [1]
    assert again.restore_latest(abstract_like(_state(0.0))).step == 1
    again.close()


@pytest.mark.parametrize("field,value", [("every_steps", 0), ("max_to_keep", 0)])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"checkpoint.{field}"):
        CheckpointConfig(**{field: value})
