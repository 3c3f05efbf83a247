"""What only a GPU host can check: vLLM's sleep mode and tensor-parallel sidecars.

    python -m pytest -q -s tests/test_rollout_sidecar_gpu.py   # the first thing to run on a GPU

Skipped without NVIDIA GPUs (vLLM's CPU build refuses sleep mode, and runs one device); the
tensor-parallel test needs 2 GPUs. Needs the CUDA vLLM venv (`bash scripts/make_vllm_venv.sh
.venv-vllm` on the GPU host). The trainer side stays on CPU here (tests/conftest.py sets
JAX_PLATFORMS=cpu), so the GPUs belong to the sidecars; the oracle is the embedded JAX engine on
the same float32 weights, as in the CPU tests.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import jax
import pytest
from hf_fixtures import make_tiny_hf_checkpoint

from configs import tiny
from dynamo_jax import engine_factory as factory
from dynamo_jax.config import from_config_dict
from dynamo_jax.models import hf_io
from dynamo_jax.rollout.jax_engine import JaxEngine, JaxEngineConfig
from dynamo_jax.rollout.protocol import Request, SamplingParams

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = os.environ.get("DYNAMO_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))


def _gpus() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


GPUS = _gpus()
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(GPUS == 0, reason="needs an NVIDIA GPU (sleep mode, tensor parallel)"),
    pytest.mark.skipif(not Path(VLLM_PYTHON).is_file(), reason=f"no vLLM venv at {VLLM_PYTHON}"),
]
SHAPE = dict(hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256, seed=5)
REQUESTS = [Request(100 + i, p, 2) for i, p in enumerate([(5, 6, 7, 8), (9, 10, 11), (200, 3)])]
GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)


def _used_mib(device: int) -> float:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", str(device)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return float(out.stdout.strip())


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    ckpt = make_tiny_hf_checkpoint(root, "qwen2", tie=False, **SHAPE)
    model_cfg, params = hf_io.load_hf_checkpoint(ckpt)
    embedded = JaxEngine(model_cfg, params, JaxEngineConfig(min_batch=4, max_batch=8))
    yield root, ckpt, model_cfg, params, embedded
    embedded.close()


def _fleet(model, work: str, devices: list[str], **rollout):
    root, ckpt, model_cfg, _, _ = model
    config = tiny.get_config()
    for key, value in dataclasses.asdict(model_cfg).items():
        config.model[key] = value
    config.init.checkpoint = str(ckpt)
    config.rollout.update(
        engine="vllm", sidecar_python=VLLM_PYTHON, vllm_dtype="float32", max_new_tokens=8,
        vllm_enforce_eager=True, vllm_max_num_seqs=8, gpu_memory_utilization=0.3, **rollout,
    )  # fmt: skip
    return factory.build_sidecar_fleet(from_config_dict(config), root / work, devices)


def _greedy(engine):
    return [c.token_ids.tolist() for c in engine.generate(REQUESTS, GREEDY)]


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_frees_the_device_and_wakes_with_the_pushed_weights(model, level):
    _, _, _, params, embedded = model
    fleet = _fleet(model, f"sleep{level}", ["0"], vllm_sleep_level=level)
    try:
        # Asleep after each generate: the KV cache (most of the 0.3 share) is released.
        total = float(
            subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits",
                 "-i", "0"], capture_output=True, text=True, check=True,
            ).stdout.strip()
        )  # fmt: skip
        first = _greedy(fleet)
        asleep = _used_mib(0)
        print(f"level {level}: {asleep:.0f} MiB used of {total:.0f} while the sidecar sleeps")
        assert asleep < 0.15 * total, "the sleeping sidecar still holds its share"
        assert "Sleep mode freed" in fleet.local[0].log_path.read_text()
        assert first == _greedy(embedded)
        # A push wakes the weights (level 2: fresh pages), is verified, and serves.
        changed = jax.tree.map(lambda x: x * 1.25 + 0.01, params)
        fleet.update_weights(changed, 1)
        embedded.update_weights(changed, 1)
        assert _greedy(fleet) == _greedy(embedded) != first
        fleet.update_weights(params, 2)
        embedded.update_weights(params, 2)
        assert _greedy(fleet) == first
    finally:
        fleet.close()


@pytest.mark.skipif(GPUS < 2, reason="tensor parallel 2 needs 2 GPUs")
def test_tensor_parallel_2_serves_and_every_rank_verifies(model):
    _, _, _, params, embedded = model
    fleet = _fleet(model, "tp2", ["0", "1"], vllm_tensor_parallel=2)
    try:
        assert [s.config.devices for s in fleet.local] == ["0,1"]
        assert _greedy(fleet) == _greedy(embedded)
        changed = jax.tree.map(lambda x: x * 1.25 + 0.01, params)
        fleet.update_weights(changed, 1)
        embedded.update_weights(changed, 1)
        assert _greedy(fleet) == _greedy(embedded)
        sidecar = fleet.local[0]
        reply = sidecar._call({"op": "fingerprint", "names": sidecar._push.check_names()})
        assert sorted(r["rank"] for r in reply["ranks"]) == [0, 1]
        embed = [r["tensors"]["model.embed_tokens.weight"] for r in reply["ranks"]]
        assert [e["shape"] for e in embed] == [[128, 64], [128, 64]]  # vocabulary split in two
    finally:
        fleet.close()
