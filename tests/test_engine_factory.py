"""The engine factory's sidecar fleet, with the sidecars replaced by recorders (no vLLM).

What the factory decides: how many sidecars, each one's device group, log file, label and push
tag; the run-config fields each sidecar gets; one export per host into a directory named for
this (workdir, process); leftover push directories of this run removed before anything starts.
The fleet's behaviour with real sidecars is in test_rollout_sidecar_fleet.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from configs import tiny
from dynamo_jax import engine_factory as factory
from dynamo_jax.config import from_config_dict
from dynamo_jax.errors import ConfigError
from dynamo_jax.rollout import sidecar_client, weight_push
from dynamo_jax.rollout.process_split import SplitEngine


class RecordingSidecar:
    """Stands in for VLLMSidecarEngine: keeps its arguments."""

    def __init__(self, config, model_cfg, workdir, *, log_name, label, push_tag):
        self.config, self.workdir, self.log_name = config, Path(workdir), log_name
        self.label, self.push_tag, self.closed = label, push_tag, False

    def close(self):
        self.closed = True


def _cfg(tmp_path, **rollout):
    (tmp_path / "ckpt").mkdir(exist_ok=True)
    (tmp_path / "ckpt" / "config.json").write_text("{}")  # what SidecarConfig checks for
    config = tiny.get_config()
    config.rollout.engine = "vllm"
    config.rollout.sidecar_python = sys.executable
    config.init.checkpoint = str(tmp_path / "ckpt")
    for key, value in rollout.items():
        config.rollout[key] = value
    return from_config_dict(config)


@pytest.fixture
def recorded(monkeypatch):
    monkeypatch.setattr(sidecar_client, "VLLMSidecarEngine", RecordingSidecar)


def test_one_sidecar_per_device_group_with_the_run_config_fields(recorded, tmp_path):
    cfg = _cfg(
        tmp_path, vllm_tensor_parallel=2, call_timeout_s=45.0, max_restarts=5,
        restart_window_s=600.0, vllm_sleep_level=1, gpu_memory_utilization=0.3,
        call_timeout_factor=4.0, call_timeout_floor_s=7.0,
    )  # fmt: skip
    work = tmp_path / "work"
    gpus = [str(i) for i in range(8)]
    engine = factory.build_sidecar_fleet(cfg, work, gpus)
    assert isinstance(engine, SplitEngine) and len(engine.local) == 4  # 8 GPUs / TP 2
    tag = weight_push.push_tag(work, 0)
    for index, (sidecar, group) in enumerate(zip(engine.local, ["0,1", "2,3", "4,5", "6,7"])):
        assert dict(sidecar.config.extra_env) == {"CUDA_VISIBLE_DEVICES": group}
        assert sidecar.config.devices == group
        assert sidecar.workdir == work and sidecar.log_name == f"vllm_sidecar{index}.log"
        assert sidecar.label == f"sidecar {index} (devices {group})"
        assert sidecar.push_tag == tag
        c = sidecar.config
        assert (c.tensor_parallel, c.call_timeout_s, c.max_restarts, c.restart_window_s) == (
            2, 45.0, 5, 600.0,
        )  # fmt: skip
        assert (c.sleep_level, c.gpu_memory_utilization) == (1, 0.3)
        assert (c.call_timeout_factor, c.call_timeout_floor_s) == (4.0, 7.0)
        assert c.llm_kwargs()["tensor_parallel_size"] == 2
        assert c.llm_kwargs()["enable_sleep_mode"] is True
    engine.close()
    assert all(s.closed for s in engine.local)


def test_cpu_gets_one_sidecar_with_the_classic_log_name(recorded, tmp_path):
    engine = factory.build_sidecar_fleet(_cfg(tmp_path), tmp_path / "w", [])
    (sidecar,) = engine.local
    assert sidecar.log_name == "vllm_sidecar.log"
    assert sidecar.config.devices == "0"  # nominal on CPU
    assert factory.trainer_accelerators() == []  # the tests run JAX on CPU (conftest.py)


def test_several_processes_keep_their_logs_and_pushes_apart(recorded, monkeypatch, tmp_path):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    work = tmp_path / "w"
    engine = factory.build_sidecar_fleet(_cfg(tmp_path, sidecars_per_host=2), work, [])
    assert engine.process_index == 1 and engine.process_count == 2
    assert [s.workdir for s in engine.local] == [work / "sidecar_process1"] * 2
    assert [s.label for s in engine.local] == [
        "sidecar 0 of process 1 (devices 0)",
        "sidecar 1 of process 1 (devices 1)",
    ]
    assert {s.push_tag for s in engine.local} == {weight_push.push_tag(work, 1)}


def test_leftover_pushes_of_this_run_are_removed_and_the_export_is_tagged(
    recorded, monkeypatch, tmp_path
):
    work = tmp_path / "w"
    tag = weight_push.push_tag(work, 0)
    # What a SIGKILLed run leaves in /dev/shm (its process never ran its cleanup).
    left = weight_push.write_push_dir({"a": np.ones(2)}, "/dev/shm", 7, tag)
    other = weight_push.write_push_dir({"a": np.ones(2)}, "/dev/shm", 7, "another-run")
    cfg = _cfg(tmp_path)
    try:
        engine = factory.build_sidecar_fleet(cfg, work, [])
        assert not left.directory.exists() and other.directory.exists()
        exported = []
        monkeypatch.setattr(
            weight_push, "export_push_dir", lambda *args: exported.append(args) or "push"
        )
        assert engine.export("params", 3) == "push"
        assert exported == [("params", cfg.model, "/dev/shm", 3, "bfloat16", tag)]
    finally:
        left.remove()
        other.remove()


def test_a_sidecar_that_fails_to_start_closes_the_others(monkeypatch, tmp_path):
    started = []

    class FailsSecond(RecordingSidecar):
        def __init__(self, config, *args, **kwargs):
            if config.devices == "1":
                raise sidecar_client.SidecarStartError("sidecar 1 never became healthy")
            super().__init__(config, *args, **kwargs)
            started.append(self)

    monkeypatch.setattr(sidecar_client, "VLLMSidecarEngine", FailsSecond)
    with pytest.raises(sidecar_client.SidecarStartError, match="sidecar 1"):
        factory.build_sidecar_fleet(_cfg(tmp_path, sidecars_per_host=3), tmp_path / "w", [])
    assert len(started) == 2 and all(s.closed for s in started)


def test_missing_checkpoint_is_a_config_error(recorded, tmp_path):
    config = tiny.get_config()
    config.rollout.engine = "vllm"
    with pytest.raises(ConfigError, match="init.checkpoint"):
        factory.build_sidecar_fleet(from_config_dict(config), tmp_path, [])


def _engine_cfg(devices):
    config = tiny.get_config()
    config.jax_engine.devices = devices
    return from_config_dict(config)


def test_the_embedded_engine_on_its_own_mesh_samples_what_the_shared_one_does(tmp_path):
    """jax_engine.devices = 2: rows split over two devices, weights replicated on both (copied at
    every push); the same tokens and log-probs as the engine on the trainer's device."""
    from dynamo_jax.models.qwen import init_params
    from dynamo_jax.rollout.protocol import Request, SamplingParams

    cfg = _engine_cfg(2)
    params = init_params(cfg.model, jax.random.key(0))
    own = factory.build_engine(cfg, params, None, None, tmp_path)
    shared = factory.build_engine(_engine_cfg(0), params, None, None, tmp_path)
    assert own._mesh.devices.size == 2 and own._mesh.shape["data"] == 2 and shared._mesh is None
    rng = np.random.default_rng(3)
    reqs = [
        Request(i, tuple(int(t) for t in rng.integers(3, cfg.model.vocab_size, n)), 3)
        for i, n in enumerate([4, 9, 6])
    ]
    sp = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5)
    for version in (0, 1):
        if version:  # a push: new weights reach both devices of the engine's mesh
            params = jax.tree.map(lambda x: x * 1.5, params)
            own.update_weights(params, 1)
            shared.update_weights(params, 1)
            for leaf, want in zip(jax.tree.leaves(own._params), jax.tree.leaves(params)):
                assert len(leaf.sharding.device_set) == 2 and leaf.sharding.is_fully_replicated
                for shard in leaf.addressable_shards:
                    np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(want))
                # The trainer's own device keeps the trainer's buffer (device_put reuses it):
                # a push copies once, to the other device.
                (mine,) = [s.data for s in leaf.addressable_shards if s.device in want.devices()]
                assert mine.unsafe_buffer_pointer() == want.unsafe_buffer_pointer()
        got, want = own.generate(reqs, sp), shared.generate(reqs, sp)
        assert len(got) == 9
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a.token_ids, b.token_ids)
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
            assert a.weight_version == version


def test_more_engine_devices_than_jax_has_is_a_config_error(tmp_path):
    cfg = _engine_cfg(len(jax.local_devices()) + 1)
    with pytest.raises(ConfigError, match=r"jax_engine.devices = \d+, but JAX has \d+ local"):
        factory.build_engine(cfg, {}, None, None, tmp_path)
    with pytest.raises(ValueError, match="JaxEngineConfig.devices must be an int >= 0"):
        _engine_cfg(-1)


def test_a_hub_model_id_reaches_the_sidecar_as_its_snapshot(recorded, tmp_path, monkeypatch):
    """init.checkpoint = "org/name" in a run started from Python (launch.py resolves it before):
    the sidecar starts from the Hub cache's snapshot, resolved offline by huggingface_hub."""
    from helpers.hub_cache import put_in_hub_cache

    source = tmp_path / "src"
    source.mkdir()
    (source / "config.json").write_text("{}")
    snapshot = put_in_hub_cache(tmp_path / "hf" / "hub", "org/tiny", source, "a" * 40)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    config = tiny.get_config()
    config.rollout.engine = "vllm"
    config.rollout.sidecar_python = sys.executable
    config.init.checkpoint = "org/tiny@main"
    engine = factory.build_sidecar_fleet(from_config_dict(config), tmp_path / "w", [])
    (sidecar,) = engine.local
    assert sidecar.config.model_path == str(snapshot)
    assert sidecar.config.llm_kwargs()["model"] == str(snapshot.resolve())
    engine.close()
