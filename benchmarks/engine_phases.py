"""The embedded engine's generate, split into its programs (prefill / decode), at a run's shape.

A random model of the named preset (no checkpoint load), `--prompts` prompts of mixed lengths up
to `--prompt_len` tokens, `--n` samples each, exactly `--new` new tokens (no stop token), plain
sampling at T = 1. Prints the median seconds of a whole `generate` and of its prefill, decode and compact programs
(timed inside the call, after one compiling call) for the current engine and for the previous
implementation (`share_prefill=False`: one prompt forward per row), rounds interleaved, with the
range of the load average: figures from a loaded machine only compare within one run.

    python -m benchmarks.engine_phases                                 # SmolLM2-135M, 8 x 8 x 24
    python -m benchmarks.engine_phases --preset tiny-qwen3 --vocab 32 --prompts 16 --new 4 \
        --prompt_len 15                                     # configs/tiny.py's shape
    python -m benchmarks.engine_phases --preset small-qwen3 --vocab 32 --prompts 16 --new 32 \
        --prompt_len 15                                     # peer_trl.py's small shape
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.harness import block_until_ready, header, load_average


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="smollm2-135m")
    parser.add_argument("--vocab", type=int, default=0, help="override the preset's vocabulary")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--new", type=int, default=24)
    parser.add_argument("--prompt_len", type=int, default=45, help="longest prompt (tokens)")
    parser.add_argument("--max_batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(header(f"engine_phases: {args.preset}, {args.prompts} x {args.n} x {args.new}"))

    import jax
    import numpy as np

    from dynamo_jax.models import qwen
    from dynamo_jax.models.presets import get_preset
    from dynamo_jax.rollout import jax_engine
    from dynamo_jax.rollout.config import JaxEngineConfig
    from dynamo_jax.rollout.protocol import Request, SamplingParams

    cfg = get_preset(args.preset, **({"vocab_size": args.vocab} if args.vocab else {}))
    params = qwen.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    lengths = np.linspace(args.prompt_len * 0.6, args.prompt_len, args.prompts).astype(int)
    requests = [
        Request(i, tuple(int(t) for t in rng.integers(0, cfg.vocab_size, int(n))), args.n)
        for i, n in enumerate(lengths)
    ]
    sp = SamplingParams(max_new_tokens=args.new, temperature=1.0, seed=0)
    config = JaxEngineConfig(max_batch=args.max_batch)
    # The previous implementation (one prompt forward per row) beside the current one, rounds
    # alternating, so load from other work falls on both alike.
    engines = {
        "per-row prefill": jax_engine.JaxEngine(cfg, params, config, share_prefill=False),
        "shared prefill": jax_engine.JaxEngine(cfg, params, config),
    }
    phases: dict[str, float] = {}

    def timed(engine):
        original_call = engine._call

        def timed_call(name, program, *a, **kw):
            start = time.perf_counter()
            out = block_until_ready(original_call(name, program, *a, **kw))
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - start
            return out

        engine._call = timed_call
        return engine

    outputs = {}
    for label, engine in engines.items():
        outputs[label] = timed(engine).generate(requests, sp)  # compile
    same = all(
        np.array_equal(a.token_ids, b.token_ids) for a, b in zip(*outputs.values(), strict=True)
    )
    max_dlogp = max(
        float(np.max(np.abs(a.logprobs - b.logprobs)))
        for a, b in zip(*outputs.values(), strict=True)
    )
    runs: dict[str, list] = {label: [] for label in engines}
    loads = []
    for r in range(args.repeats):
        order = list(engines) if r % 2 == 0 else list(engines)[::-1]
        for label in order:
            phases.clear()
            start = time.perf_counter()
            engines[label].generate(requests, sp)
            runs[label].append((time.perf_counter() - start, dict(phases)))
            loads.append(load_average())
    tokens = sum(len(c.token_ids) for c in outputs["shared prefill"])
    print(
        f"{args.preset} (vocab {cfg.vocab_size}): {args.prompts} prompts x {args.n} samples x {args.new} new tokens, "
        f"prompts {lengths.min()}-{lengths.max()} tokens, {jax.devices()[0].platform}; "
        f"median of {args.repeats} interleaved rounds; load {min(loads):.1f}-{max(loads):.1f}"
    )
    print(f"  same tokens: {same}; max |log-prob difference| {max_dlogp:.2e}")
    names = sorted({k for rs in runs.values() for _, s in rs for k in s})
    print(f"  {'':16s} {'generate':>9s} " + " ".join(f"{n:>9s}" for n in names) + "  tokens/s")
    for label, rs in runs.items():
        total = statistics.median(t for t, _ in rs)
        cols = " ".join(f"{statistics.median(s.get(n, 0.0) for _, s in rs):9.3f}" for n in names)
        print(f"  {label:16s} {total:9.3f} {cols}  {tokens / total:8.0f}")


if __name__ == "__main__":
    main()
