"""Check the GPU attention paths against "blockwise", in one call: max abs differences of the
output and of dq/dk/dv (forward + backward), and the forward + backward step time, at a few
lengths of packed rows.

    python scripts/gpu_check_attention.py                      # 1k, 4k, 8k, 16k on a GPU
    python scripts/gpu_check_attention.py --lengths 1024,4096  # fewer
    python scripts/gpu_check_attention.py --heads 40 --kv_heads 8  # Qwen3-14B's heads
    python scripts/gpu_check_attention.py --pallas_block 32 --pallas_bwd_block 16  # other tiles

Shapes default to Qwen2.5-7B's attention (28 query heads, 4 kv heads, head_dim 128), one row
per length packed with sequences of uneven length and a tail of empty slots. Differences are
measured in float32 (every implementation that runs float32) on real tokens only (empty slots
carry no meaning, attention_pallas.py); times in bfloat16 ("pallas", "blockwise", "cudnn" is
bf16-only), median of --iters runs after one warm-up, each `block_until_ready`.

"cudnn" is the model's existing path: `jax.nn.dot_product_attention` with the dense [B, L, S]
mask (no segment ids in JAX 0.10's cuDNN API); it is timed for comparison and its difference
reported like the others.

Without a GPU it says so, then runs what a CPU can: blockwise vs matmul at a short length and
the Pallas kernel through its interpreter at a tiny one (the wiring, not the speed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.attention_speed import packed_segments  # noqa: E402
from dynamo_jax.models import qwen  # noqa: E402
from dynamo_jax.models.attention_blockwise import blockwise_attention  # noqa: E402
from dynamo_jax.models.attention_pallas import pallas_attention  # noqa: E402


def impls(block: int, interpret: bool = False, pallas_blocks: tuple[int, int] = (64, 32)):
    def matmul(q, k, v, slot, seg):
        return qwen.attend(q, k, v, qwen.attention_mask(slot, seg, seg), True)

    def cudnn(q, k, v, slot, seg):
        mask = qwen.attention_mask(slot, seg, seg)[:, None]
        return jax.nn.dot_product_attention(
            q, k, v, mask=mask, is_causal=True, implementation="cudnn"
        )

    def blockwise(q, k, v, slot, seg):
        return blockwise_attention(q, k, v, slot, seg, seg, block_q=block, block_k=block)

    def pallas(q, k, v, slot, seg):
        fwd, bwd = pallas_blocks
        return pallas_attention(
            q, k, v, seg, block_q=fwd, block_k=fwd, block_backward=bwd, interpret=interpret
        )

    return dict(blockwise=blockwise, matmul=matmul, pallas=pallas, cudnn=cudnn)


def qkv(length, heads, kv_heads, e, dtype, seed=1):
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], (1, length, heads, e), dtype)
    k = jax.random.normal(keys[1], (1, length, kv_heads, e), dtype)
    v = jax.random.normal(keys[2], (1, length, kv_heads, e), dtype)
    w = jax.random.normal(keys[3], (1, length, heads, e), jnp.float32)
    return q, k, v, w


def fwd_bwd(fn, slot, seg, w):
    real = (seg > 0)[..., None, None]

    def loss(q, k, v):
        out = fn(q, k, v, slot, seg)
        return jnp.sum(jnp.where(real, out.astype(jnp.float32), 0) * w), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def max_diffs(got, ref, seg):
    (_, out), grads = got
    (_, out_ref), grads_ref = ref
    real = (np.asarray(seg) > 0)[..., None, None]
    d = [float(np.abs(np.where(real, np.asarray(out, np.float32) - out_ref, 0)).max())]
    d += [float(np.abs(np.asarray(a, np.float32) - b).max()) for a, b in zip(grads, grads_ref)]
    return d


def timed(step, args, iters):
    jax.block_until_ready(step(*args))  # compile + warm-up
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(step(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def check(
    lengths, names, heads, kv_heads, e, block, iters, interpret=False, time_it=True,
    pallas_blocks=(64, 32),
):  # fmt: skip
    fns = impls(block, interpret, pallas_blocks)
    print(
        f"heads {heads}/{kv_heads}, head_dim {e}, blockwise blocks {block}; diffs: float32, real "
        "tokens, vs blockwise; time: bf16 forward + backward, median of "
        f"{iters} (device: {jax.devices()[0].device_kind})"
    )
    print("| length | impl | max abs diff out | dq | dk | dv | fwd+bwd ms | vs blockwise |")
    print("|---|---|---|---|---|---|---|---|")
    for length in lengths:
        seg = jnp.asarray(packed_segments(length))
        slot = jnp.arange(length)
        q, k, v, w = qkv(length, heads, kv_heads, e, jnp.float32)
        ref = jax.device_get(fwd_bwd(fns["blockwise"], slot, seg, w)(q, k, v))
        ref_time = None
        for name in ["blockwise"] + [n for n in names if n != "blockwise"]:
            try:
                diffs = ["-"] * 4
                if name != "cudnn":  # cuDNN flash attention is bf16/fp16 only
                    got = jax.device_get(fwd_bwd(fns[name], slot, seg, w)(q, k, v))
                    diffs = [f"{x:.2e}" for x in max_diffs(got, ref, seg)]
                ms = "-"
                if time_it:
                    bf = [x.astype(jnp.bfloat16) for x in (q, k, v)]
                    sec = timed(fwd_bwd(fns[name], slot, seg, w), bf, iters)
                    ref_time = sec if name == "blockwise" else ref_time
                    ms = f"{sec * 1e3:.2f} | {sec / ref_time:.2f}x"
                else:
                    ms = "- | -"
                print(f"| {length} | {name} | {' | '.join(diffs)} | {ms} |", flush=True)
            except Exception as exc:  # report and go on: one failing path must not hide others
                msg = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
                print(
                    f"| {length} | {name} | failed: {type(exc).__name__}: {msg} |||||", flush=True
                )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,4096,8192,16384")
    parser.add_argument("--impls", default="blockwise,pallas,cudnn,matmul")
    parser.add_argument("--heads", type=int, default=28)
    parser.add_argument("--kv_heads", type=int, default=4)
    parser.add_argument("--head_dim", type=int, default=128)
    parser.add_argument("--block", type=int, default=512, help="blockwise block_q = block_k")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument(
        "--pallas_block", type=int, default=64, help="pallas forward blocks (at most 64)"
    )
    parser.add_argument("--pallas_bwd_block", type=int, default=32, help="pallas backward blocks")
    args = parser.parse_args()
    names = args.impls.split(",")
    if jax.default_backend() == "gpu":
        lengths = [int(x) for x in args.lengths.split(",")]
        check(
            lengths, names, args.heads, args.kv_heads, args.head_dim, args.block, args.iters,
            pallas_blocks=(args.pallas_block, args.pallas_bwd_block),
        )  # fmt: skip
        return 0
    print(
        f"SKIP: no GPU (backend {jax.default_backend()!r}); the fused paths (pallas, cudnn) need "
        "an NVIDIA GPU. CPU fallback: blockwise vs matmul at 512 tokens, then the Pallas kernel "
        "through its interpreter at 64 tokens (wiring only, not timed)."
    )
    check([512], ["matmul"], 4, 2, 64, 128, 2)
    check([64], ["pallas"], 4, 2, 32, 32, 1, interpret=True, time_it=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
