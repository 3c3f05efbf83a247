"""Cost of one weight push to the vLLM sidecar, against a train step and a plain memory copy.

    python benchmarks/weight_push.py                      # tiny-qwen2 and qwen2.5-0.5b shapes
    python benchmarks/weight_push.py --models tiny-qwen2 --batch 2 --seq 128

For each model (random weights of a preset's shape, float32 on CPU):
  - push: `VLLMSidecarEngine.update_weights(params, version)` end to end: gather + convert +
    write (hf_io's streaming export to /dev/shm) and the sidecar's in-place vLLM reload + prefix
    cache reset. The first push compiles the export's per-chunk device ops; the second (warm)
    one is what every later step pays, and is the figure compared.
  - step: the trainer's own jitted step (`step.train_step.make_train_step`: forward, log-probs,
    entropy, DynaMO loss, backward, AdamW; state donated) on `batch x seq` random tokens, one
    device. Besides push/step for that size it prints the tokens per step at which the push
    would be 5 % of the step, from the measured per-token step cost.
  - memcpy: `np.copyto` of the same number of bytes, the ceiling for any host-side transfer.
Target (issue): push <= 5% of the step time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from dynamo_jax.models import hf_io, qwen
from dynamo_jax.models.presets import get_preset
from dynamo_jax.rollout.sidecar_client import SidecarConfig, VLLMSidecarEngine

REPO = Path(__file__).resolve().parents[1]


def time_step(cfg, batch: int, seq: int, repeats: int = 2) -> tuple[float, object]:
    """Best-of-`repeats` seconds of the trainer's own jitted step, and the params it left."""
    from step_throughput import one_device_step  # a sibling script: benchmarks/ is on sys.path

    from dynamo_jax.losses.config import LossConfig

    step, state, data = one_device_step(cfg, LossConfig.preset("dynamo"), batch, seq, 1e-6)
    state, metrics = step(state, data)  # compile
    jax.block_until_ready(metrics)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        state, metrics = step(state, data)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - start)
    return min(times), state.params


def time_memcpy(nbytes: int) -> float:
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return best


def bench(name: str, python: str, batch: int, seq: int, workdir: Path) -> None:
    cfg = get_preset(name, dtype="float32", param_dtype="float32", scan_layers=True)
    ckpt = hf_io.save_hf_checkpoint(
        qwen.init_params(cfg, jax.random.key(0)), cfg, workdir / name, dtype="float32"
    )
    config = SidecarConfig(
        python=python, model_path=str(ckpt), dtype="float32", max_model_len=256,
        enforce_eager=True, max_num_seqs=8, startup_timeout_s=900, call_timeout_s=900,
    )  # fmt: skip
    with VLLMSidecarEngine(config, cfg, workdir / f"{name}-work") as engine:
        step_s, params = time_step(cfg, batch, seq)
        engine.update_weights(params, 1)
        cold = engine.last_push
        engine.update_weights(params, 2)
        push = engine.last_push
    memcpy_s = time_memcpy(push.nbytes)
    gb = push.nbytes / 1e9
    tokens = batch * seq
    per_token_s = step_s / tokens  # the step's fixed overhead counted as per-token cost
    tokens_at_5pct = push.total_s / (0.05 * per_token_s)
    print(
        f"{name}: {cfg.num_params / 1e6:.1f} M params, {gb:.3f} GB pushed (float32)\n"
        f"  push (warm) {push.total_s:.3f} s = export {push.export_s:.3f} s + vLLM reload {push.reload_s:.3f} s"
        f"   [cold first push {cold.total_s:.3f} s]\n"
        f"  train step (make_train_step, DynaMO loss, AdamW; {batch}x{seq} = {tokens} tokens) "
        f"{step_s:.3f} s -> push / step = {100 * push.total_s / step_s:.1f} %  (target <= 5 %)\n"
        f"  push is 5 % of a step of >= {tokens_at_5pct:,.0f} tokens "
        f"({1e3 * per_token_s:.2f} ms/token measured)\n"
        f"  export {gb / push.export_s:.2f} GB/s, whole push {gb / push.total_s:.2f} GB/s vs memcpy "
        f"{gb / memcpy_s:.2f} GB/s -> export at {100 * memcpy_s / push.export_s:.1f} %, push at "
        f"{100 * memcpy_s / push.total_s:.1f} % of the memcpy ceiling",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny-qwen2,qwen2.5-0.5b")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    default_python = os.environ.get(
        "DYNAMO_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python")
    )
    parser.add_argument("--vllm-python", default=default_python)
    args = parser.parse_args()
    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs",
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory(prefix="weight-push-bench-") as tmp:
        for name in args.models.split(","):
            bench(name, args.vllm_python, args.batch, args.seq, Path(tmp))


if __name__ == "__main__":
    main()
