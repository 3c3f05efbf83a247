"""The trainer's update with layers scanned (`scan_layers=True`) vs unrolled, same shape, one run.

    python -m benchmarks.scan_vs_unrolled                                 # small-qwen3, 64 x 48
    python -m benchmarks.scan_vs_unrolled --preset smollm2-135m --vocab 0 --batch 64 --seq 64

Runs `step.train_step.make_train_step` (GRPO loss, AdamW) on the same random batch for both
layouts and prints the first call's seconds (compilation) and the median step time of each,
then the ratio scanned / unrolled (> 1: unrolled is faster). Single-threaded by default, like
`decode_profile.py`; run it under `taskset -c N` on a quiet core.
"""

from __future__ import annotations

import argparse

from benchmarks.harness import Timing, header, pin_threads, time_calls


def time_update(preset: str, vocab: int, scan: bool, batch: int, seq: int, iters: int) -> Timing:
    """The update's step times with `scan_layers=scan`; the warm-up is the first call
    (compilation)."""
    from benchmarks.step_throughput import one_device_step
    from dynamo_jax.losses.config import LossConfig
    from dynamo_jax.models.presets import get_preset

    cfg = get_preset(preset, scan_layers=scan, **({"vocab_size": vocab} if vocab else {}))
    step, state, data = one_device_step(cfg, LossConfig.preset("grpo"), batch, seq, 1e-5)
    holder = {"state": state}

    def update():
        holder["state"], metrics = step(holder["state"], data)
        return holder["state"], metrics

    return time_calls(update, repeats=iters, warmup=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small-qwen3")
    parser.add_argument("--vocab", type=int, default=32, help="0 = the preset's vocabulary")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=48)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    pin_threads(args.threads)  # before JAX starts
    print(header(f"scan_vs_unrolled: {args.preset} (vocab {args.vocab or 'preset'}), "
                 f"{args.batch} x {args.seq} tokens, {args.threads} thread(s)"))  # fmt: skip
    results = {}
    for scan in (True, False):
        timing = time_update(args.preset, args.vocab, scan, args.batch, args.seq, args.iters)
        results[scan] = step = timing.median
        label = "scanned " if scan else "unrolled"
        print(f"  {label}: first call {timing.warmup_seconds[0]:6.1f} s   step {step * 1e3:9.1f} "
              f"ms (median of {args.iters}, min {timing.min * 1e3:.1f}, max {timing.max * 1e3:.1f})")  # fmt: skip
    print(f"scanned / unrolled step time: {results[True] / results[False]:.2f}")


if __name__ == "__main__":
    main()
