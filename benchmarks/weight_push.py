"""Cost of one verified weight push to 1 and 2 vLLM sidecars, against a train step and a memcpy.

    python -m benchmarks.weight_push                      # tiny-qwen2 and qwen2.5-0.5b shapes
    python -m benchmarks.weight_push --models tiny-qwen2 --sidecars 1,2 --batch 2 --seq 128
    python -m benchmarks.weight_push --models qwen2.5-0.5b --layers 4   # fewer layers, less RAM

For each model (random weights of a preset's shape, float32 on CPU) and each sidecar count, the
sidecars are built by the engine factory as a run builds them (`rollout.sidecars_per_host`),
and `update_weights(params, version)` is timed in its three parts:
  - export: gather + convert + write of hf_io's streaming export into ONE shared directory in
    /dev/shm, once per host whatever the number of sidecars;
  - reload: every sidecar's in-place vLLM reload + prefix-cache reset, all at once (the slowest);
  - verify: every sidecar reads the checked tensors back from its engine and their digests are
    compared with the pushed file's (the slowest sidecar, including the file's digests).
The first push compiles the export's per-chunk device ops; the second (warm) one is what every
later step pays, and is the figure compared. Peers measured in the same run:
  - step: the trainer's own jitted step (`step.train_step.make_train_step`: forward, log-probs,
    entropy, DynaMO loss, backward, AdamW; state donated) on `batch x seq` random tokens, one
    device; the push is also given as the tokens per step at which it would be 5 % of a step.
  - memcpy: `np.copyto` of the same number of bytes, the ceiling for any host-side transfer.
  - 1 sidecar: the 2-sidecar push relative to the 1-sidecar one (the export is shared; reload
    and verification run in parallel, so the ideal ratio is 1.0).
Target (issue): push <= 5% of the step time.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from pathlib import Path

from benchmarks.harness import ROOT as REPO
from benchmarks.harness import header, time_calls

# On a GPU host JAX shares the devices with the sidecars (gpu_memory_utilization 0.4 each):
# launch.py would set this from rollout.jax_memory_fraction; this script sets it itself.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from configs import tiny  # noqa: E402
from dynamo_jax.config import from_config_dict  # noqa: E402
from dynamo_jax.engine_factory import build_sidecar_fleet, trainer_accelerators  # noqa: E402
from dynamo_jax.models import hf_io, qwen  # noqa: E402
from dynamo_jax.models.presets import get_preset  # noqa: E402


def time_step(cfg, batch: int, seq: int, repeats: int = 2) -> tuple[float, object]:
    """Best-of-`repeats` seconds of the trainer's own jitted step (after one compiling call),
    and the params it left."""
    from benchmarks.step_throughput import one_device_step
    from dynamo_jax.losses.config import LossConfig

    step, state, data = one_device_step(cfg, LossConfig.preset("dynamo"), batch, seq, 1e-6)
    holder = {"state": state}

    def update():
        holder["state"], metrics = step(holder["state"], data)
        return holder["state"], metrics

    return time_calls(update, repeats=repeats, warmup=1).min, holder["state"].params


def time_memcpy(nbytes: int) -> float:
    """Best of 3 seconds of copying `nbytes` host bytes."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    return time_calls(lambda: np.copyto(dst, src), repeats=3, warmup=0).min


def run_config(model_cfg, ckpt: Path, python: str, sidecars: int):
    """The tiny config with this model, vLLM sidecars on `ckpt`, float32 on CPU."""
    config = tiny.get_config()
    for key, value in dataclasses.asdict(model_cfg).items():
        config.model[key] = value
    config.init.checkpoint = str(ckpt)
    config.rollout.update(
        engine="vllm", sidecar_python=python, vllm_dtype="float32", vllm_enforce_eager=True,
        vllm_max_num_seqs=8, sidecars_per_host=sidecars, call_timeout_s=900.0,
        jax_memory_fraction=0.5,
    )  # fmt: skip
    return from_config_dict(config)


def bench(
    name: str, python: str, counts: list[int], batch: int, seq: int, layers: int, root: Path
) -> None:
    cfg = get_preset(name, dtype="float32", param_dtype="float32", scan_layers=True)
    if layers:
        cfg = cfg.replace(num_layers=layers)
    ckpt = hf_io.save_hf_checkpoint(
        qwen.init_params(cfg, jax.random.key(0)), cfg, root / name, dtype="float32"
    )
    step_s, params = time_step(cfg, batch, seq)
    tokens = batch * seq
    per_token_s = step_s / tokens  # the step's fixed overhead counted as per-token cost
    print(
        f"{name} ({cfg.num_layers} layers): {cfg.num_params / 1e6:.1f} M params; train step "
        f"(make_train_step, DynaMO loss, AdamW; {batch}x{seq} = {tokens} tokens) {step_s:.3f} s",
        flush=True,
    )
    first = None
    for count in counts:
        run_cfg = run_config(cfg, ckpt, python, count)
        workdir = root / f"{name}-work{count}"
        engine = build_sidecar_fleet(run_cfg, workdir, trainer_accelerators())
        try:
            engine.update_weights(params, 1)
            cold = engine.last_push
            engine.update_weights(params, 2)
            push = engine.last_push
        finally:
            engine.close()
        assert engine.exports == 2, engine.exports
        memcpy_s = time_memcpy(push.nbytes)
        gb = push.nbytes / 1e9
        first = first or push
        print(
            f"  {count} sidecar(s), {gb:.3f} GB pushed once (float32), warm push {push.total_s:.3f} s"
            f" = export {push.export_s:.3f} + reload {push.reload_s:.3f}"
            f" + verify {push.verify_s:.3f} s  [cold first push {cold.total_s:.3f} s]\n"
            f"    push / step = {100 * push.total_s / step_s:.1f} % (target <= 5 %); 5 % of a step"
            f" of >= {push.total_s / (0.05 * per_token_s):,.0f} tokens"
            f" ({1e3 * per_token_s:.2f} ms/token measured)\n"
            f"    verify / push = {100 * push.verify_s / push.total_s:.1f} %; export at "
            f"{100 * memcpy_s / push.export_s:.1f} % of the memcpy ceiling ({gb / memcpy_s:.2f} GB/s)"
            f"; vs 1 sidecar: {push.total_s / first.total_s:.2f}x",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny-qwen2,qwen2.5-0.5b")
    parser.add_argument("--sidecars", default="1,2", help="sidecar counts to measure")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--layers", type=int, default=0, help="cut each model to this many layers")
    default_python = os.environ.get(
        "DYNAMO_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python")
    )
    parser.add_argument("--vllm-python", default=default_python)
    args = parser.parse_args()
    print(header(f"weight_push: {args.models}, sidecars {args.sidecars}"))
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}", flush=True)
    counts = [int(c) for c in args.sidecars.split(",")]
    with tempfile.TemporaryDirectory(prefix="weight-push-bench-") as tmp:
        for name in args.models.split(","):
            bench(name, args.vllm_python, counts, args.batch, args.seq, args.layers, Path(tmp))


if __name__ == "__main__":
    main()
