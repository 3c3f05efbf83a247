"""XLA:CPU's two homes for matrix products, timed on the trainer's step and the engine's decode.

    python -m benchmarks.xla_cpu_dots                              # small-qwen3, 1 thread
    python -m benchmarks.xla_cpu_dots --threads 2
    python -m benchmarks.xla_cpu_dots --preset smollm2-135m --vocab 0 --seq 80 --shared 64,8 \
        --rows 64 --slots 80 --iters 2

XLA:CPU hands a program's products to YNNPACK fusions (its default in JAX 0.10) or to its own
Eigen emitter (`xla_cpu_experimental_ynn_fusion_type=""`). The trainer compiles its programs
the second way and the engine's keep the default (dynamo_jax/step/xla_options.py); this prints
why, measured in one run: the train step (`step_throughput.one_device_step`, GRPO, AdamW; with
`--shared` the shared-prompt layout) and `--steps` decode steps of `models/decode.decode_step`
in a `fori_loop` as the engine runs them, each compiled both ways, timed interleaved, medians.
A ratio above 1 means the trainer's choice (Eigen) is the faster one there.
"""

from __future__ import annotations

import argparse

from benchmarks.harness import header, load_average, pin_threads, time_interleaved

NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}


def train_steps(cfg, batch: int, seq: int, shared) -> dict:
    """{"ynn", "eigen"}: zero-argument runs of one train step compiled each way."""
    from benchmarks.step_throughput import one_device_step
    from dynamo_jax.losses.config import LossConfig
    from dynamo_jax.step import xla_options

    out = {}
    saved = dict(xla_options._CPU_TRAINER_OPTIONS)
    for name, options in (("ynn", {}), ("eigen", NO_YNN)):
        xla_options._CPU_TRAINER_OPTIONS.clear()
        xla_options._CPU_TRAINER_OPTIONS.update(options)
        step, state, data = one_device_step(
            cfg, LossConfig.preset("grpo"), batch, seq, 1e-5, shared
        )
        holder = {"state": state}

        def run(step=step, holder=holder, data=data):
            holder["state"], metrics = step(holder["state"], data)
            return metrics

        out[name] = run
    xla_options._CPU_TRAINER_OPTIONS.clear()
    xla_options._CPU_TRAINER_OPTIONS.update(saved)
    return out


def decode_loops(cfg, rows: int, slots: int, steps: int) -> dict:
    """{"ynn", "eigen"}: zero-argument runs of `steps` decode steps compiled each way."""
    import jax
    import jax.numpy as jnp

    from dynamo_jax.models import qwen
    from dynamo_jax.models.decode import decode_step, init_cache, prefill

    params = qwen.init_params(cfg, jax.random.key(0))
    prompt = max(1, slots - steps)
    tokens = jnp.ones((rows, prompt), jnp.int32)
    cache = init_cache(cfg, rows, slots)
    _, cache = jax.jit(prefill, static_argnums=1)(params, cfg, tokens, tokens, cache)

    def loop(params, cache, tok_B):
        params, layers_cfg = qwen.unrolled_layers(params, cfg)

        def body(_, carry):
            cache, tok_B = carry
            logits_BxV, cache = decode_step(params, layers_cfg, tok_B, cache)
            return cache, jnp.argmax(logits_BxV, -1).astype(jnp.int32)

        return jax.lax.fori_loop(0, steps, body, (cache, tok_B))

    out = {}
    for name, options in (("ynn", None), ("eigen", NO_YNN)):
        program = jax.jit(loop, compiler_options=options)
        out[name] = lambda program=program: program(params, cache, tokens[:, 0])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small-qwen3")
    parser.add_argument("--vocab", type=int, default=32, help="0 = the preset's vocabulary")
    parser.add_argument("--batch", type=int, default=64, help="train step rows")
    parser.add_argument("--seq", type=int, default=48, help="train step tokens per row")
    parser.add_argument("--shared", default="16,16", help="P,G shared prompts; '' = off")
    parser.add_argument("--rows", type=int, default=128, help="decode rows")
    parser.add_argument("--slots", type=int, default=48, help="decode cache slots")
    parser.add_argument("--steps", type=int, default=32, help="decode steps per timed loop")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="1 = XLA's pool off; else all")
    args = parser.parse_args()
    pin_threads(args.threads)  # before JAX starts
    from dynamo_jax.models.presets import get_preset

    overrides = {"scan_layers": False, **({"vocab_size": args.vocab} if args.vocab else {})}
    cfg = get_preset(args.preset, **overrides)
    shared = tuple(int(x) for x in args.shared.split(",")) if args.shared else None
    print(header(f"xla_cpu_dots: {args.preset} (vocab {cfg.vocab_size}), "
                 f"{args.threads} thread(s), medians of {args.iters} interleaved"))  # fmt: skip
    rows = [
        (f"train step, {args.batch} x {args.seq}" + (f", shared {shared}" if shared else ""),
         train_steps(cfg, args.batch, args.seq, shared)),
        (f"{args.steps} decode steps, {args.rows} rows, {args.slots} slots",
         decode_loops(cfg, args.rows, args.slots, args.steps)),
    ]  # fmt: skip
    print(f"  {'program':48s} {'YNNPACK ms':>11s} {'Eigen ms':>9s} {'YNNPACK/Eigen':>14s}")
    for label, programs in rows:
        med = time_interleaved(programs, repeats=args.iters, warmup=1)
        ynn, eigen = med["ynn"].median * 1e3, med["eigen"].median * 1e3
        print(f"  {label:48s} {ynn:11.1f} {eigen:9.1f} {ynn / eigen:14.2f}")
    print(f"load at the end {load_average():.2f}")


if __name__ == "__main__":
    main()
