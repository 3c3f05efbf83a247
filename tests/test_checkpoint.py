"""Checkpoint items, checksums, damaged-step fallback (moved aside), layout mismatch, retention,
and the non-finite guard."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.checkpoint_items import _host, _items, _mesh, _save, _tree_equal
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from dynamo_jax.checkpoint import (
    CheckpointConfig,
    Checkpointer,
    DamagedStepError,
    NonFiniteStateError,
    abstract_like,
)
from dynamo_jax.checkpoint_checksums import _leaf_sums, device_checksums
from dynamo_jax.errors import CheckpointError


def _array_file(item_dir):
    """An item's array data: the largest of orbax's OCDBT data files."""
    files = [f for f in item_dir.glob("ocdbt.process_*/d/*") if f.is_file()]
    return max(files, key=lambda f: f.stat().st_size)


def _flip(path, bit: int):
    data = bytearray(path.read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))


# ----------------------------------------------------------------------------- items


def test_round_trip_keeps_values_dtypes_shardings_and_host_state(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(every_steps=1, max_to_keep=2))
    items = _items(1.5)
    ckpt.save(4, device=items, host=_host(4), meta={"config": {"lr": 1e-6}, "step": 4})
    got = ckpt.restore_latest(abstract_like(items))
    assert got.step == 4
    _tree_equal(got.device, items)
    assert got.device["params"]["b"].dtype == jnp.bfloat16
    assert got.device["params"]["w"].sharding == items["params"]["w"].sharding
    np.testing.assert_array_equal(got.host["history"]["G"], np.arange(5) * 4)
    assert got.host["history"]["k"].dtype == np.float64
    assert float(got.host["temperature"]["tau"]) == 0.73
    assert int(got.host["data"]["position"]) == 4
    assert got.meta["config"] == {"lr": 1e-6} and got.meta["step"] == 4
    assert set(got.meta["checksums"]) == {"params", "opt_state", "progress", "host", "config"}
    ckpt.close()


def test_parameters_restore_alone_without_the_optimizer_item(tmp_path):
    """Export and evaluation: the params item is read on its own, onto another layout."""
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig())
    items = _items(2.0)
    ckpt.save(1, device=items, host=_host(1), meta={"step": 1})
    ckpt.close()
    for item in ("opt_state", "progress", "host"):  # none of them is needed
        for f in sorted((tmp_path / "ck" / "1" / item).rglob("*"), reverse=True):
            f.unlink() if f.is_file() else f.rmdir()
        (tmp_path / "ck" / "1" / item).rmdir()
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    template = {
        "params": jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), items["params"]
        )
    }
    reader = Checkpointer(tmp_path / "ck", CheckpointConfig(), read_only=True)
    got = reader.restore_latest(template, host=False)
    reader.close()
    assert got.step == 1 and set(got.device) == {"params"} and got.host is None
    _tree_equal(got.device["params"], items["params"])
    assert got.device["params"]["w"].sharding == one


# ----------------------------------------------------------------------------- checksums


def _reference_sums(x) -> tuple[int, int]:
    """The two sums of `_leaf_sums` in Python integers over NumPy's raw bytes."""
    a = np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
    if a.dtype == np.bool_:
        a = a.astype(np.uint8)
    words = a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]).reshape(-1)
    s1 = s2 = 0
    for i, w in enumerate(int(v) for v in words):
        s1 += w * (2 * i + 1)
        s2 += (w ^ (w >> 16)) * (((i * 0x9E3779B1) % 2**32) | 1)
    return s1 % 2**32, s2 % 2**32


@pytest.mark.parametrize(
    "x",
    [
        jnp.linspace(-3.0, 7.0, 24, dtype=jnp.float32).reshape(2, 3, 4),
        jnp.asarray([1.5, -2.25, 1e-3, 65504.0], jnp.bfloat16),
        jnp.asarray([[-7, 2**31 - 1], [0, -(2**31)]], jnp.int32),
        jnp.asarray([True, False, True]),
        jax.random.key(11),
        jnp.float32(3.25),
    ],
    ids=["f32", "bf16", "int32", "bool", "key", "scalar"],
)
def test_leaf_sums_match_the_reference(x):
    got = tuple(int(v) for v in np.asarray(_leaf_sums(x)))
    assert got == _reference_sums(x)


def test_leaf_sums_hand_worked():
    # uint32 words [1, 2, 3]: s1 = 1·1 + 2·3 + 3·5 = 22;
    # s2 = 1·(0 | 1) + 2·(0x9E3779B1 | 1) + 3·((2·0x9E3779B1 mod 2^32) | 1)
    #    = 1 + 2·2654435761 + 3·1013904227 = 8350584204 → mod 2^32 = 4055616908
    # (the words are below 2^16, so w ^ w >> 16 = w).
    got = np.asarray(_leaf_sums(jnp.asarray([1, 2, 3], jnp.uint32)))
    assert [int(v) for v in got] == [22, 4055616908]


def test_checksums_do_not_depend_on_the_sharding():
    x = jnp.arange(64 * 8, dtype=jnp.float32).reshape(64, 8) / 7
    sharded = jax.device_put(x, NamedSharding(_mesh(), P("data", "tensor")))
    assert device_checksums({"x": sharded}) == device_checksums({"x": x})


def test_every_single_bit_flip_changes_the_checksum():
    x = np.asarray(jax.random.normal(jax.random.key(0), (3, 5)), np.float32)
    base = device_checksums({"x": jnp.asarray(x)})
    words = x.view(np.uint32).copy()
    for i in range(words.size):
        for bit in range(32):
            flipped = words.copy().reshape(-1)
            flipped[i] ^= np.uint32(1 << bit)
            y = jnp.asarray(flipped.view(np.float32).reshape(x.shape))
            assert device_checksums({"x": y}) != base, (i, bit)


# ----------------------------------------------------------------------------- damage


def test_flipped_bits_in_the_array_file_are_damage(tmp_path, caplog):
    """One flipped bit anywhere in the parameters' array file: the step is reported damaged
    and the previous one restored (before checksums it restored with a changed value)."""
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(every_steps=1, max_to_keep=5))
    _save(ckpt, 1)
    _save(ckpt, 2)
    ckpt.wait()
    target = _array_file(tmp_path / "ck" / "2" / "params")
    original = target.read_bytes()
    rng = np.random.default_rng(0)
    for bit in rng.integers(0, len(original) * 8, size=12):
        _flip(target, int(bit))
        with pytest.raises(DamagedStepError):
            ckpt.restore(2, abstract_like(_items(0.0)))
        target.write_bytes(original)
    _flip(target, int(rng.integers(0, len(original) * 8)))
    with caplog.at_level(logging.WARNING):
        got = ckpt.restore_latest(abstract_like(_items(0.0)))
    assert got.step == 1 and "step 2" in caplog.text and "damaged" in caplog.text
    _tree_equal(got.device, _items(1.0))
    ckpt.close()


def test_a_flip_in_any_written_file_never_restores_other_values(tmp_path):
    """Flips outside the array data (metadata, manifests) either fail the restore, fail a
    checksum, or change nothing that is read back: nothing silently different is returned."""
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig())
    _save(ckpt, 1)
    ckpt.wait()
    files = sorted(f for f in (tmp_path / "ck" / "1").rglob("*") if f.is_file())
    rng = np.random.default_rng(1)
    for f in files:
        original = f.read_bytes()
        if not original:
            continue
        _flip(f, int(rng.integers(0, len(original) * 8)))
        try:
            got = ckpt.restore(1, abstract_like(_items(0.0)))
        except (DamagedStepError, CheckpointError):
            pass
        else:
            _tree_equal(got.device, _items(1.0))
            jax.tree.map(np.testing.assert_array_equal, got.host, _host(1))
        f.write_bytes(original)
    ckpt.close()


def test_damaged_steps_are_moved_aside_so_they_can_be_written_again(tmp_path, caplog):
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(every_steps=1, max_to_keep=2))
    for step in (1, 2, 3):
        _save(ckpt, step)
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3]
    _flip(_array_file(tmp_path / "ck" / "3" / "params"), 7)
    # A reader (export) skips it and changes nothing.
    reader = Checkpointer(tmp_path / "ck", CheckpointConfig(), read_only=True)
    assert reader.restore_latest(abstract_like(_items(0.0))).step == 2
    reader.close()
    assert ckpt.all_steps() == [2, 3]
    # A training run moves it aside and can then write step 3 again.
    with caplog.at_level(logging.WARNING):
        got = ckpt.restore_latest(abstract_like(_items(0.0)), move_damaged=True)
    assert got.step == 2 and "moved aside to 3.damaged-1" in caplog.text
    _tree_equal(got.device, _items(2.0))
    _save(ckpt, 3)
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3]
    assert ckpt.damaged_dirs() == [tmp_path / "ck" / "3.damaged-1"]
    ckpt.close()


def test_every_step_damaged_is_an_error_also_after_they_were_moved(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(every_steps=1, max_to_keep=3))
    for step in (1, 2):
        _save(ckpt, step)
    ckpt.wait()
    for step in (1, 2):
        _flip(_array_file(tmp_path / "ck" / str(step) / "params"), 100)
    for _ in range(2):
        with pytest.raises(
            CheckpointError, match=r"every step is damaged \(1.damaged-1, 2.damaged-1\)"
        ):
            ckpt.restore_latest(abstract_like(_items(0.0)), move_damaged=True)
    assert ckpt.all_steps() == []
    ckpt.close()


def test_a_step_that_does_not_fit_is_an_error_not_damage(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig())
    _save(ckpt, 1)
    ckpt.wait()
    other = _items(1.0)
    other["params"]["w"] = jnp.zeros((64, 65), jnp.float32)  # another model shape
    with pytest.raises(
        CheckpointError,
        match=r"'params' item does not fit.*w: saved float32\[64, 64\], expected float32\[64, 65\]",
    ):
        ckpt.restore_latest(abstract_like(other), move_damaged=True)
    assert ckpt.all_steps() == [1] and ckpt.damaged_dirs() == []

    # check_meta (the resume rule on the saved config) runs first and its error propagates.
    def refuse(step, meta):
        raise CheckpointError(f"step {step} lr {meta['config']['lr']}")

    with pytest.raises(CheckpointError, match="step 1 lr 1e-06"):
        ckpt.restore_latest(abstract_like(_items(0.0)), check_meta=refuse, move_damaged=True)
    assert ckpt.all_steps() == [1]
    ckpt.close()


# ----------------------------------------------------------------------------- guards


def test_refuses_to_save_non_finite_state(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(every_steps=1, max_to_keep=2))
    items = _items(1.0)
    items["params"]["w"] = items["params"]["w"].at[0, 0].set(jnp.nan)
    with pytest.raises(NonFiniteStateError, match=r"\['params'\]\['w'\]"):
        ckpt.save(1, device=items, host=_host(1), meta={})
    assert ckpt.all_steps() == []
    assert ckpt.restore_latest(abstract_like(items)) is None
    ckpt.close()


def test_unfinished_temporary_step_is_ignored(tmp_path):
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(every_steps=1, max_to_keep=3))
    _save(ckpt, 1)
    ckpt.close()
    # What a SIGKILL during a save leaves behind: an uncommitted temporary directory.
    (tmp_path / "ck" / "2.orbax-checkpoint-tmp-123").mkdir()
    again = Checkpointer(tmp_path / "ck", CheckpointConfig(every_steps=1, max_to_keep=3))
    assert again.all_steps() == [1]
    assert again.restore_latest(abstract_like(_items(0.0))).step == 1
    again.close()


def test_read_only_needs_an_existing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        Checkpointer(tmp_path / "nope", CheckpointConfig(), read_only=True)
    assert not (tmp_path / "nope").exists()


@pytest.mark.parametrize("field,value", [("every_steps", 0), ("max_to_keep", 0)])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"checkpoint.{field}"):
        CheckpointConfig(**{field: value})
