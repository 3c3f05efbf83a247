"""Cost of one weight push to the vLLM sidecar, against a train step and a plain memory copy.

    python benchmarks/weight_push.py                      # tiny-qwen2 and qwen2.5-0.5b shapes
    python benchmarks/weight_push.py --models tiny-qwen2 --batch 2 --seq 128

For each model (random weights of a preset's shape, float32 on CPU):
  - push: `VLLMSidecarEngine.update_weights(params, version)` end to end: gather + convert +
    write (hf_io's streaming export to /dev/shm) and the sidecar's in-place vLLM reload + prefix
    cache reset. The first push compiles the export's per-tensor slices; the second (warm) one is
    what every later step pays, and is the figure compared.
  - step: a plain jitted forward + backward + optax AdamW update of the Flax model on
    `batch x seq` random tokens (next-token cross-entropy), params and optimizer state donated.
    It stands in for the trainer's step, which does more work per update (several micro-batches,
    the DynaMO loss), so the share printed is an upper bound on the push's real share.
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
import jax.numpy as jnp
import numpy as np
import optax

from dynamo_jax.models import hf_io, qwen
from dynamo_jax.models.presets import get_preset
from dynamo_jax.rollout.sidecar_client import SidecarConfig, VLLMSidecarEngine

REPO = Path(__file__).resolve().parents[1]


def make_step(cfg, optimizer):
    def loss_fn(params, tokens_BxL):
        mask = jnp.ones_like(tokens_BxL)
        logits = qwen.forward(params, cfg, tokens_BxL, qwen.positions_from_mask(mask), mask)
        logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
        return -jnp.take_along_axis(logp, tokens_BxL[:, 1:, None], axis=-1).mean()

    def step(params, opt_state, tokens_BxL):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens_BxL)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


def time_step(cfg, params, batch: int, seq: int, repeats: int = 2) -> tuple[float, object]:
    optimizer = optax.adamw(1e-6)
    opt_state = optimizer.init(params)
    step = make_step(cfg, optimizer)
    tokens = jax.random.randint(jax.random.key(1), (batch, seq), 0, cfg.vocab_size)
    params, opt_state, loss = step(params, opt_state, tokens)  # compile
    jax.block_until_ready(loss)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, tokens)
        jax.block_until_ready(loss)
        times.append(time.perf_counter() - start)
    del opt_state
    return min(times), params


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
    cfg = get_preset(name, dtype="float32", param_dtype="float32")
    params = qwen.init_params(cfg, jax.random.key(0))
    ckpt = hf_io.save_hf_checkpoint(params, cfg, workdir / name, dtype="float32")
    config = SidecarConfig(
        python=python, model_path=str(ckpt), dtype="float32", max_model_len=256,
        enforce_eager=True, max_num_seqs=8, startup_timeout_s=900, call_timeout_s=900,
    )  # fmt: skip
    with VLLMSidecarEngine(config, cfg, workdir / f"{name}-work") as engine:
        step_s, params = time_step(cfg, params, batch, seq)
        engine.update_weights(params, 1)
        cold = engine.last_push
        engine.update_weights(params, 2)
        push = engine.last_push
    memcpy_s = time_memcpy(push.nbytes)
    gb = push.nbytes / 1e9
    print(
        f"{name}: {cfg.num_params / 1e6:.1f} M params, {gb:.3f} GB pushed (float32)\n"
        f"  push (warm) {push.total_s:.3f} s = export {push.export_s:.3f} s + vLLM reload {push.reload_s:.3f} s"
        f"   [cold first push {cold.total_s:.3f} s]\n"
        f"  train step ({batch}x{seq} tokens, fwd+bwd+AdamW) {step_s:.3f} s"
        f"  -> push / step = {100 * push.total_s / step_s:.1f} %  (target <= 5 %)\n"
        f"  rate {gb / push.total_s:.2f} GB/s vs memcpy {gb / memcpy_s:.2f} GB/s"
        f"  -> {100 * memcpy_s / push.total_s:.1f} % of the memcpy ceiling",
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
