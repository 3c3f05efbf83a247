"""The trainer's update with layers scanned (`scan_layers=True`) vs unrolled, same shape, one run.

    python benchmarks/scan_vs_unrolled.py                                   # small-qwen3, 64 x 48
    python benchmarks/scan_vs_unrolled.py --preset smollm2-135m --vocab 0 --batch 64 --seq 64

Runs `step.train_step.make_train_step` (GRPO loss, AdamW) on the same random batch for both
layouts and prints the first call's seconds (compilation) and the median step time of each,
then the ratio scanned / unrolled (> 1: unrolled is faster). Single-threaded by default, like
`decode_profile.py`; run it under `taskset -c N` on a quiet core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def time_update(preset: str, vocab: int, scan: bool, batch: int, seq: int, iters: int):
    """(first call seconds, median step seconds) of the update with `scan_layers=scan`."""
    import jax
    from step_throughput import one_device_step

    from dynamo_jax.losses.config import LossConfig
    from dynamo_jax.models.presets import get_preset

    cfg = get_preset(preset, scan_layers=scan, **({"vocab_size": vocab} if vocab else {}))
    step, state, data = one_device_step(cfg, LossConfig.preset("grpo"), batch, seq, 1e-5)
    start = time.perf_counter()
    state, metrics = step(state, data)
    jax.block_until_ready(metrics)
    first = time.perf_counter() - start
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        state, metrics = step(state, data)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small-qwen3")
    parser.add_argument("--vocab", type=int, default=32, help="0 = the preset's vocabulary")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=48)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.threads == 1:  # before JAX starts: XLA's own pool off, one thread
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        )
    print(f"{args.preset} (vocab {args.vocab or 'preset'}), {args.batch} x {args.seq} tokens, "
          f"{args.threads} thread(s), load {os.getloadavg()[0]:.2f}")  # fmt: skip
    results = {}
    for scan in (True, False):
        first, step = time_update(args.preset, args.vocab, scan, args.batch, args.seq, args.iters)
        results[scan] = step
        label = "scanned " if scan else "unrolled"
        print(f"  {label}: first call {first:6.1f} s   step {step * 1e3:9.1f} ms")
    print(f"scanned / unrolled step time: {results[True] / results[False]:.2f}")


if __name__ == "__main__":
    main()
