"""Blockwise vs matmul attention on CPU: forward + backward time and temporary memory.

    python -m benchmarks.attention_speed                       # 1k, 4k, 8k tokens
    python -m benchmarks.attention_speed --lengths 1024 --iters 5

One packed row (sequences of uneven length, a tail of empty slots), 4 query heads over 2 kv
heads of 64 (a small model's attention; the ratios, not the absolute times, are the point),
float32. The function timed is the gradient of sum(attention(q, k, v) · w) w.r.t. q, k and v,
jitted, median of `--iters` runs after a warm-up. Memory is XLA's compiled temporary size for
that function (`memory_analysis().temp_size_in_bytes`), i.e. the peak scratch the
implementation needs, not the inputs.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import header, time_calls
from dynamo_jax.models import qwen
from dynamo_jax.models.attention_blockwise import blockwise_attention


def packed_segments(length: int, seed: int = 0) -> np.ndarray:
    """One row: sequences of 10%-60% of the row laid end to end, the last ~3% empty."""
    rng = np.random.default_rng(seed)
    seg = np.zeros((1, length), np.int32)
    start, k, end = 0, 1, length - max(1, length // 32)
    while start < end:
        n = min(end - start, int(rng.uniform(0.1, 0.6) * length))
        seg[0, start : start + n] = k
        start, k = start + n, k + 1
    return seg


def grad_fn(impl: str, slot, seg, block: int):
    def attention(q, k, v):
        if impl == "matmul":
            return qwen.attend(q, k, v, qwen.attention_mask(slot, seg, seg), True)
        return blockwise_attention(q, k, v, slot, seg, seg, block_q=block, block_k=block)

    def loss(q, k, v, w):
        return jnp.sum(attention(q, k, v) * w)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def measure(impl, length, heads, kv_heads, e, block, iters, max_run_bytes):
    """(median seconds or None when not run, compiled temporary bytes)."""
    seg = jnp.asarray(packed_segments(length))
    slot = jnp.arange(length)
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (1, length, heads, e))
    k = jax.random.normal(keys[1], (1, length, kv_heads, e))
    v = jax.random.normal(keys[2], (1, length, kv_heads, e))
    w = jax.random.normal(keys[3], (1, length, heads, e))
    fn = grad_fn(impl, slot, seg, block)
    compiled = fn.lower(q, k, v, w).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    if temp > max_run_bytes:  # compiled only: its memory figure stands, its time is not taken
        return None, temp
    return time_calls(lambda: compiled(q, k, v, w), repeats=iters, warmup=1).median, temp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,4096,8192")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv_heads", type=int, default=2)
    parser.add_argument("--head_dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=512)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument(
        "--max_run_gib",
        type=float,
        default=1.5,
        help="compile but do not run a case needing more temporary memory (shared machines)",
    )
    args = parser.parse_args()
    print(header("attention_speed"))
    print(
        f"fwd+bwd, 1 packed row, {args.heads}/{args.kv_heads} heads of {args.head_dim}, float32, "
        f"blockwise blocks {args.block}, median of {args.iters} ({jax.default_backend()})"
    )
    print(
        "| tokens | matmul ms | blockwise ms | time blockwise/matmul | matmul temp MiB | "
        "blockwise temp MiB | memory matmul/blockwise |"
    )
    print("|---|---|---|---|---|---|---|")
    for length in [int(x) for x in args.lengths.split(",")]:
        shape = (length, args.heads, args.kv_heads, args.head_dim, args.block, args.iters)
        t_m, m_m = measure("matmul", *shape, args.max_run_gib * 1024**3)
        t_b, m_b = measure("blockwise", *shape, args.max_run_gib * 1024**3)
        mib = 1024**2
        ms = lambda t: "not run" if t is None else f"{t * 1e3:.1f}"
        ratio = "-" if t_m is None or t_b is None else f"{t_b / t_m:.2f}"
        print(
            f"| {length} | {ms(t_m)} | {ms(t_b)} | {ratio} | {m_m / mib:.1f} | "
            f"{m_b / mib:.1f} | {m_m / m_b:.1f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
