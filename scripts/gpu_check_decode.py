"""The embedded engine's decode tokens/s against the HBM-bandwidth bound, at batches 64 to 256.

    python scripts/gpu_check_decode.py --out decode.json                  # qwen2.5-0.5b, bf16
    python scripts/gpu_check_decode.py --preset tiny-qwen3 --batches 4 --prompt 8 --new 8 \
        --bandwidth_gbs 50                                                # CPU: the wiring only

A decode step must read every weight once (the input embedding only for the batch's rows) and
each row's KV cache up to its position, so at batch b and mean context c

    bound tokens/s = b · bandwidth / (weight bytes + b · c · layers · 2 · kv_heads · head_dim · bytes)

with c = prompt + new / 2 (every row runs to --new: random weights almost never sample the stop
id). Measured: --batches rows of one distinct random prompt of --prompt tokens each, up to --new
tokens at T = 1, top-k/top-p off; one warm-up round (compiles), then one timed round, the
generated tokens over its wall time (prefill included: the figure is a lower bound on decode's).
The bandwidth is the card's from its name (H100 3,350 GB/s, H200 4,800 GB/s) unless given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from dynamo_jax.models.presets import get_preset  # noqa: E402
from dynamo_jax.models.qwen import init_params  # noqa: E402
from dynamo_jax.rollout.jax_engine import JaxEngine, JaxEngineConfig  # noqa: E402
from dynamo_jax.rollout.protocol import Request, SamplingParams  # noqa: E402

# Peak HBM bandwidth in GB/s by a substring of jax's device_kind (SXM parts).
BANDWIDTH_GBS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}


def card_bandwidth(kind: str) -> float | None:
    return next((bw for name, bw in BANDWIDTH_GBS.items() if name in kind), None)


def weight_bytes_read(cfg, params) -> int:
    """Bytes of the weights one decode step reads: all of them, less an untied input embedding
    (only the batch's rows of it are gathered)."""
    total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    if not cfg.tie_word_embeddings:
        embed = params["embed"]["embedding"]
        total -= embed.size * embed.dtype.itemsize
    return int(total)


def bound_tokens_per_s(cfg, weights: int, batch: int, context: float, cache_bytes: int, gbs):
    kv = batch * context * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * cache_bytes
    return batch * gbs * 1e9 / (weights + kv)


def measure(cfg, params, batch: int, args) -> dict:
    rng = np.random.default_rng(batch)
    engine = JaxEngine(cfg, params, JaxEngineConfig(min_batch=min(8, batch), max_batch=batch))
    sampling = SamplingParams(max_new_tokens=args.new, temperature=1.0, top_p=1.0, top_k=-1,
                              stop_token_ids=(0,), seed=0)  # fmt: skip
    requests = [
        Request(prompt_id=i, prompt_token_ids=tuple(int(t) for t in p), n=1)
        for i, p in enumerate(rng.integers(1, cfg.vocab_size, (batch, args.prompt)))
    ]
    try:
        start = time.perf_counter()
        engine.generate(requests, sampling)  # warm-up: compiles
        warmup = time.perf_counter() - start
        start = time.perf_counter()
        tokens = sum(len(c.token_ids) for c in engine.generate(requests, sampling))
        seconds = time.perf_counter() - start
    finally:
        engine.close()
    return {"batch": batch, "tokens": tokens, "seconds": seconds, "warmup_s": warmup,
            "tokens_per_s": tokens / seconds}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=0, help="override num_layers (0 = preset)")
    parser.add_argument("--batches", default="64,256", help="comma-separated batch sizes")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens per row")
    parser.add_argument("--new", type=int, default=256, help="new tokens per row")
    parser.add_argument("--dtype", default="", help="default: bfloat16 on a GPU, else float32")
    parser.add_argument("--bandwidth_gbs", type=float, default=0.0, help="0: the card's")
    parser.add_argument("--out", default="", help="write every figure here as JSON")
    args = parser.parse_args()
    device = jax.devices()[0]
    dtype = args.dtype or ("bfloat16" if device.platform == "gpu" else "float32")
    gbs = args.bandwidth_gbs or card_bandwidth(device.device_kind)
    if not gbs:
        parser.error(f"no bandwidth known for {device.device_kind!r}: pass --bandwidth_gbs")
    overrides = {"num_layers": args.layers} if args.layers else {}
    cfg = get_preset(args.preset, dtype=dtype, param_dtype=dtype, **overrides)
    params = jax.tree.map(lambda x: x.astype(dtype), init_params(cfg, jax.random.key(0)))
    weights = weight_bytes_read(cfg, params)
    cache_bytes = np.dtype(dtype).itemsize if dtype != "bfloat16" else 2
    context = args.prompt + args.new / 2
    out = {"device": device.device_kind, "preset": args.preset, "layers": cfg.num_layers,
           "dtype": dtype, "bandwidth_gbs": gbs, "weight_bytes": weights, "prompt": args.prompt,
           "new": args.new, "runs": []}  # fmt: skip
    for batch in (int(b) for b in args.batches.split(",")):
        run = measure(cfg, params, batch, args)
        run["bound_tokens_per_s"] = bound_tokens_per_s(
            cfg, weights, batch, context, cache_bytes, gbs
        )
        run["share_of_bound"] = run["tokens_per_s"] / run["bound_tokens_per_s"]
        out["runs"].append(run)
        print(
            f"decode {args.preset} ({cfg.num_layers} layers, {dtype}) batch {batch}: "
            f"{run['tokens_per_s']:,.0f} tokens/s = {run['share_of_bound']:.1%} of the "
            f"{gbs:,.0f} GB/s bound {run['bound_tokens_per_s']:,.0f} (compile + first round "
            f"{run['warmup_s']:.1f} s)",
            flush=True,
        )
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
