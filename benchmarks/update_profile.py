"""Where the trainer's update spends its time on CPU: XLA's own per-op trace, grouped.

    python -m benchmarks.update_profile                        # small-qwen3 (vocab 32), 64 x 48
    python -m benchmarks.update_profile --preset smollm2-135m --vocab 0 --seq 80 --iters 1
    python -m benchmarks.update_profile --shared_prompts 16,16    # train.share_prompts

Runs `step.train_step.make_train_step` (GRPO loss, AdamW; `step_throughput.one_device_step`)
under `jax.profiler.trace` and sums the duration of every XLA:CPU op of the step by kind:
matrix products (dots, and the fusions XLA hands to its matmul libraries), element-wise fusions,
copies and transposes, the rest. Prints each kind's milliseconds per step and share, the top ops,
and the model FLOPs per second of the whole step and of its matrix products alone (6 N per
token, attention left out). Single-threaded by default; run it under `taskset -c N` on a quiet
core. The trace itself costs a little: compare shares, not absolute times, with other scripts.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import tempfile

from benchmarks.harness import block_until_ready, header, pin_threads

# op name (its numeric suffix removed) -> kind
_KINDS = (
    ("matrix products", re.compile(r"^(dot|dot_general|ynn_fusion|xnn_fusion|onednn|custom-call)")),
    ("copies and transposes", re.compile(r"(copy|transpose)")),
    ("element-wise fusions", re.compile(r"fusion|^wrapped_")),
)


def kind_of(name: str) -> str:
    name = re.sub(r"\.\d+$", "", name)  # "ynn_fusion.12" -> "ynn_fusion"
    for kind, pattern in _KINDS:
        if pattern.search(name):
            return kind
    return "other"


def op_durations(trace_dir: str) -> collections.Counter:
    """{op name: total microseconds} of the XLA ops in the perfetto trace under `trace_dir`."""
    (path,) = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)
    events = json.load(gzip.open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    total: collections.Counter = collections.Counter()
    for e in events:
        name = e.get("name", "")
        # Python frames ("$..."), the executor's own spans and the jit entry are not ops.
        if e.get("ph") == "X" and not name.startswith(("$", "Thunk", "PjitFunction")):
            total[name] += e["dur"]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small-qwen3")
    parser.add_argument("--vocab", type=int, default=32, help="0 = the preset's vocabulary")
    parser.add_argument("--scan_layers", action="store_true", help="scan (default: unrolled)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=48)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument(
        "--shared_prompts",
        default="",
        help="P,G: G distinct prompts of P slots run once each (train.share_prompts); '' = off",
    )
    args = parser.parse_args()
    pin_threads(args.threads)  # before JAX starts
    layout = "scanned" if args.scan_layers else "unrolled"
    print(header(f"update_profile: {args.preset} (vocab {args.vocab or 'preset'}), {layout} "
                 f"layers, {args.batch} x {args.seq} tokens, {args.threads} thread(s)"))  # fmt: skip
    import jax

    from benchmarks.step_throughput import one_device_step
    from dynamo_jax.losses.config import LossConfig
    from dynamo_jax.models.presets import get_preset

    overrides = {
        "scan_layers": args.scan_layers,
        **({"vocab_size": args.vocab} if args.vocab else {}),
    }
    cfg = get_preset(args.preset, **overrides)
    shared = tuple(int(x) for x in args.shared_prompts.split(",")) if args.shared_prompts else None
    loss_cfg = LossConfig.preset("grpo")
    step, state, data = one_device_step(cfg, loss_cfg, args.batch, args.seq, 1e-5, shared)
    state, metrics = block_until_ready(step(state, data))  # compile
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for _ in range(args.iters):
                state, metrics = step(state, data)
            block_until_ready(metrics)
        ops = op_durations(trace_dir)
    per_step_ms = {name: us / args.iters / 1e3 for name, us in ops.items()}
    total = sum(per_step_ms.values())
    kinds: collections.Counter = collections.Counter()
    for name, ms in per_step_ms.items():
        kinds[kind_of(name)] += ms
    tokens = args.batch * args.seq
    if shared:  # the tokens the model runs: G prompts, then every row's response slots
        tokens = shared[1] * shared[0] + args.batch * (args.seq - shared[0])
    flops = 6 * cfg.num_params * tokens
    print(f"XLA ops {total:.1f} ms a step")
    for kind, ms in kinds.most_common():
        print(f"  {kind:24s} {ms:9.1f} ms  {ms / total:6.1%}")
    print(f"model FLOPs/s: whole step {flops / total / 1e6:.1f} GFLOP/s, matrix products alone "
          f"{flops / kinds['matrix products'] / 1e6:.1f} GFLOP/s (6 N per token)")  # fmt: skip
    print(f"top {args.top} ops:")
    for name, ms in sorted(per_step_ms.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {ms:8.2f} ms  {kind_of(name):24s} {name}")


if __name__ == "__main__":
    main()
