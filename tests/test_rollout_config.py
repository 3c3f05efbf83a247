"""`RolloutConfig`: the sidecar fleet's fields, the memory split between JAX and vLLM, device
groups, and launch.py putting JAX's share in the environment before JAX starts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from configs import tiny
from dynamo_jax.config import from_config_dict
from dynamo_jax.errors import ConfigError
from dynamo_jax.rollout.config import JAX_MEMORY_ENV, RolloutConfig

ROOT = Path(__file__).resolve().parents[1]
GPUS = [str(i) for i in range(8)]


@pytest.mark.parametrize(
    "field, value",
    [
        ("vllm_tensor_parallel", 0),
        ("vllm_tensor_parallel", 1.5),
        ("sidecars_per_host", -1),
        ("sidecar_devices", (0, 0)),
        ("sidecar_devices", (-1,)),
        ("vllm_sleep_level", 3),
        ("jax_memory_fraction", 0.0),
        ("jax_memory_fraction", 1.2),
        ("call_timeout_s", 0.0),
        ("max_restarts", -1),
        ("restart_window_s", -5.0),
    ],
)
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"rollout.{field}"):
        RolloutConfig(**{"engine": "vllm", "sidecar_devices": (7,), field: value})


def test_colocated_shares_must_fit_one_device():
    # 0.5 + 0.5 = 1.0 > 0.95 on devices both use.
    with pytest.raises(ValueError, match=r"jax_memory_fraction \(0.5\) \+ .*= 1 of each device"):
        RolloutConfig(engine="vllm", gpu_memory_utilization=0.5, jax_memory_fraction=0.5)
    RolloutConfig(engine="vllm", gpu_memory_utilization=0.5, jax_memory_fraction=0.45)  # 0.95
    # Separate GPUs, or no vLLM at all: each pool has its devices to itself.
    RolloutConfig(
        engine="vllm", gpu_memory_utilization=0.9, jax_memory_fraction=0.9, sidecar_devices=(4,)
    )
    RolloutConfig(engine="jax", gpu_memory_utilization=0.9, jax_memory_fraction=0.9)


def test_jax_share_and_its_environment():
    colocated = RolloutConfig(engine="vllm", gpu_memory_utilization=0.4)
    assert colocated.colocated and colocated.jax_memory_share == pytest.approx(0.55)
    assert colocated.jax_memory_env({}) == {JAX_MEMORY_ENV: "0.55"}
    assert colocated.jax_memory_env({JAX_MEMORY_ENV: "0.550"}) == {JAX_MEMORY_ENV: "0.55"}
    with pytest.raises(ConfigError, match=r"=0.9 in the environment contradicts .*0.55 = 0.95 -"):
        colocated.jax_memory_env({JAX_MEMORY_ENV: "0.9"})
    explicit = RolloutConfig(engine="jax", jax_memory_fraction=0.8)
    assert explicit.jax_memory_env({}) == {JAX_MEMORY_ENV: "0.8"}
    assert RolloutConfig(engine="jax").jax_memory_env({JAX_MEMORY_ENV: "0.3"}) == {}  # untouched
    separate = RolloutConfig(engine="vllm", sidecar_devices=(6, 7))
    assert not separate.colocated and separate.jax_memory_env({}) == {}


def test_device_groups_on_an_8_gpu_host():
    tp2 = RolloutConfig(engine="vllm", vllm_tensor_parallel=2)
    assert tp2.device_groups(GPUS) == ["0,1", "2,3", "4,5", "6,7"]  # 8 // 2 sidecars
    assert RolloutConfig(engine="vllm", vllm_tensor_parallel=2, sidecars_per_host=0).device_groups(
        GPUS
    ) == ["0,1", "2,3", "4,5", "6,7"]  # 0 means the same as None
    assert RolloutConfig(engine="vllm").device_groups(GPUS) == GPUS  # TP 1: one per GPU
    two = RolloutConfig(engine="vllm", vllm_tensor_parallel=2, sidecars_per_host=2)
    assert two.device_groups(GPUS) == ["0,1", "2,3"]
    # A trainer started with CUDA_VISIBLE_DEVICES=4,5,6,7 sees those ids; the groups keep them.
    assert tp2.device_groups(["4", "5", "6", "7"]) == ["4,5", "6,7"]
    with pytest.raises(ConfigError, match=r"sidecars_per_host \(5 -> 5\) x .*\(2\) needs 10"):
        RolloutConfig(engine="vllm", vllm_tensor_parallel=2, sidecars_per_host=5).device_groups(
            GPUS
        )
    with pytest.raises(ConfigError, match="needs 4 accelerators; the sidecars have 2"):
        RolloutConfig(engine="vllm", vllm_tensor_parallel=4).device_groups(["0", "1"])


def test_separate_gpus_must_not_be_the_trainers():
    separate = RolloutConfig(engine="vllm", vllm_tensor_parallel=2, sidecar_devices=(4, 5, 6, 7))
    assert separate.device_groups(["0", "1", "2", "3"]) == ["4,5", "6,7"]
    with pytest.raises(ConfigError, match=r"also uses accelerator\(s\) \['4', '5', '6', '7'\]"):
        separate.device_groups(GPUS)  # the trainer was not restricted to GPUs 0-3


def test_cpu_groups_are_nominal_and_sleep_needs_a_gpu():
    assert RolloutConfig(engine="vllm").device_groups([]) == ["0"]
    assert RolloutConfig(engine="vllm", sidecars_per_host=2).device_groups([]) == ["0", "1"]
    assert RolloutConfig(engine="vllm", sidecars_per_host=2, vllm_tensor_parallel=2).device_groups(
        []
    ) == ["0,1", "2,3"]
    with pytest.raises(ConfigError, match="vllm_sleep_level needs GPUs"):
        RolloutConfig(engine="vllm", vllm_sleep_level=2).device_groups([])


def test_fields_come_through_the_config_file():
    config = tiny.get_config()
    config.rollout.engine = "vllm"
    config.rollout.sidecars_per_host = 4  # a placeholder typed from `int | None`
    config.rollout.sidecar_devices = (4, 5, 6, 7)
    config.rollout.vllm_tensor_parallel = 1
    cfg = from_config_dict(config).rollout
    assert (cfg.sidecars_per_host, cfg.sidecar_devices) == (4, (4, 5, 6, 7))
    config.rollout.sidecar_devices = ()
    config.rollout.jax_memory_fraction = 0.7
    with pytest.raises(ValueError, match=r"config.rollout .*jax_memory_fraction \(0.7\)"):
        from_config_dict(config)


LAUNCH = """
import os, sys
sys.argv = ["launch.py", "--config", "configs/tiny.py", "--workdir", {workdir!r}] + {flags!r}
import launch
from absl import app
import types
from jax._src import xla_bridge
from dynamo_jax.loop import train

def run(cfg, workdir, **kwargs):
    # What train.run would start JAX with.
    print("share", os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"), flush=True)
    print("backends started", xla_bridge.backends_are_initialized(), flush=True)
    return types.SimpleNamespace(exit_code=0)

train.run = run
app.run(launch.main)
"""


@pytest.mark.parametrize(
    "flags, share",
    [
        (["--config.rollout.jax_memory_fraction=0.3"], "0.3"),
        ([], "None"),  # the embedded engine and no field: JAX's own default
    ],
)
def test_launch_sets_jax_share_before_jax_starts(tmp_path, flags, share):
    env = {k: v for k, v in os.environ.items() if k != JAX_MEMORY_ENV}
    script = LAUNCH.format(workdir=str(tmp_path / "w"), flags=flags)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"share {share}\nbackends started False\n" in out.stdout
