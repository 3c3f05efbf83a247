"""Memory and time of log-prob + entropy loss-and-grad: chunked JAX vs naive JAX vs PyTorch.

Peer: (b) the naive full-logits JAX version and (c) PyTorch's straightforward
log_softmax + entropy (how verl computes it without its fused kernel), same inputs.
Compiled memory (XLA temp) comes from compile-only memory analysis of abstract shapes (no
execution, no inputs), so it is cheap for every size, naive at 16k tokens included. Timed runs
(a few minutes each on 2 CPU cores) each go in their own subprocess so peak RSS figures do not
contaminate each other.

    python -m benchmarks.loss_memory          # memory: T = 2048, 4096, 16384; timing: T = 2048
    python -m benchmarks.loss_memory --tokens 2048 4096 --time-big   # also time 4096, 16k chunked
    python -m benchmarks.loss_memory --no-time --mem-tokens 512      # quick look

Loss: Σ_t c1_t log π(a_t) + c2_t H_t with random c, gradient w.r.t. hidden states and W,
D = 1536, V = 151,936 (Qwen2.5-1.5B), fp32, temperature 0.7. Prints compiled memory
(XLA temp = intermediates, the [N, V] arrays live here), peak RSS, and time per loss+grad.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

from benchmarks.harness import ROOT, header, time_calls

D, V, TEMPERATURE = 1536, 151_936, 0.7


def _inputs(n: int):
    import numpy as np

    rng = np.random.default_rng(0)
    h = (rng.standard_normal((n, D), dtype=np.float32) * 0.5).astype(np.float32)
    w = (rng.standard_normal((D, V), dtype=np.float32) * 0.05).astype(np.float32)
    t = rng.integers(0, V, size=n).astype(np.int32)
    c = rng.standard_normal((2, n), dtype=np.float32)
    return h, w, t, c


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _time(fn, reps: int) -> tuple[float, object]:
    """(best-of-`reps` seconds, the last call's output). JAX is compiled ahead of time (AOT), so
    the first call is already a steady-state call; on a shared 2-core machine each loss+grad
    takes minutes, so no extra warm-up call."""
    out = []

    def call():
        out[:] = [fn()]
        return out[0]

    return time_calls(call, repeats=reps, warmup=0).min, out[0]


def _step(impl: str, t, c, block_size: int, vocab_tile: int):
    """jit(value_and_grad) of Σ c1 log π(a) + c2 H w.r.t. (hidden, W) for one implementation."""
    import jax
    import jax.numpy as jnp

    from dynamo_jax.losses import naive_token_logprobs_entropy, token_logprobs_entropy

    if impl == "chunked":
        f = lambda h, w: token_logprobs_entropy(
            h, w, t, TEMPERATURE, block_size=block_size, vocab_tile=vocab_tile
        )
    else:
        f = lambda h, w: naive_token_logprobs_entropy(h, w, t, TEMPERATURE)

    def loss(h, w):
        logp, ent, _ = f(h, w)
        return jnp.sum(logp * c[0] + ent * c[1])

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def compiled_temp_mb(impl: str, n: int, block_size: int, vocab_tile: int) -> float:
    """XLA temp of the compiled loss+grad for abstract inputs: compile only, nothing runs."""
    import jax
    import jax.numpy as jnp

    t, c = jax.ShapeDtypeStruct((n,), jnp.int32), jax.ShapeDtypeStruct((2, n), jnp.float32)
    h, w = jax.ShapeDtypeStruct((n, D), jnp.float32), jax.ShapeDtypeStruct((D, V), jnp.float32)
    # t and c become arguments here (constants in the timed runs): a few KB, not temp.
    step = jax.jit(lambda h, w, t, c: _step(impl, t, c, block_size, vocab_tile)(h, w))
    return step.lower(h, w, t, c).compile().memory_analysis().temp_size_in_bytes / 1e6


def run_jax(impl: str, n: int, reps: int, block_size: int, vocab_tile: int) -> dict:
    import jax.numpy as jnp

    h, w, t, c = (jnp.asarray(x) for x in _inputs(n))
    compiled = _step(impl, t, c, block_size, vocab_tile).lower(h, w).compile()
    ma = compiled.memory_analysis()
    print("COMPILED " + json.dumps(dict(temp_mb=ma.temp_size_in_bytes / 1e6)), flush=True)
    rss_inputs = _rss_mb()

    def call():
        value, (gh, gw) = compiled(h, w)
        return value, gh, gw

    secs, (value, gh, gw) = _time(call, reps)
    return dict(
        secs=secs, temp_mb=ma.temp_size_in_bytes / 1e6, out_mb=ma.output_size_in_bytes / 1e6,
        arg_mb=ma.argument_size_in_bytes / 1e6, rss_mb=_rss_mb(), rss_inputs_mb=rss_inputs,
        loss=float(value), gh_norm=float(jnp.linalg.norm(gh)), gw_norm=float(jnp.linalg.norm(gw)),
    )  # fmt: skip


def run_torch(n: int, reps: int) -> dict:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    h, w, t, c = (torch.from_numpy(x) for x in _inputs(n))
    t = t.long()
    rss_inputs = _rss_mb()

    def call():
        hh = h.clone().requires_grad_(True)
        ww = w.clone().requires_grad_(True)
        logits = (hh @ ww) / TEMPERATURE
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, t[:, None])[:, 0]
        ent = -(logp_all.exp() * logp_all).sum(-1)
        loss = (logp * c[0] + ent * c[1]).sum()
        loss.backward()
        return loss.detach(), hh.grad, ww.grad

    secs, (value, gh, gw) = _time(call, reps)
    return dict(
        secs=secs, rss_mb=_rss_mb(), rss_inputs_mb=rss_inputs, loss=float(value),
        gh_norm=float(gh.norm()), gw_norm=float(gw.norm()),
    )  # fmt: skip


def _child(args) -> None:
    if args.one == "torch":
        res = run_torch(args.tokens[0], args.reps)
    else:
        res = run_jax(args.one, args.tokens[0], args.reps, args.block_size, args.vocab_tile)
    print("RESULT " + json.dumps(res), flush=True)


def _spawn(impl: str, n: int, args) -> dict | None:
    cmd = [sys.executable, "-m", "benchmarks.loss_memory", "--one", impl, "--tokens", str(n), "--reps", str(args.reps),
           "--block-size", str(args.block_size), "--vocab-tile", str(args.vocab_tile)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    why = "killed (out of memory?)" if proc.returncode == -9 else proc.stderr.strip()[-400:]
    compiled = [ln for ln in proc.stdout.splitlines() if ln.startswith("COMPILED ")]
    temp = f"; compiled temp {json.loads(compiled[0][9:])['temp_mb']:.1f} MB" if compiled else ""
    print(f"{impl:8s} T={n:6d}  failed (rc {proc.returncode}): {why}{temp}", flush=True)
    return None


def _row(impl, n, r) -> str:
    mem = f"temp {r['temp_mb']:9.1f} MB" if "temp_mb" in r else "temp       n/a   "
    return (f"{impl:8s} T={n:6d}  {mem}  peak RSS {r['rss_mb']:8.1f} MB "
            f"(inputs {r['rss_inputs_mb']:7.1f})  time {r['secs']:7.2f} s  "
            f"loss {r['loss']:.6e}  |dh| {r['gh_norm']:.5e}  |dW| {r['gw_norm']:.5e}")  # fmt: skip


def _ratio(a: float, b: float) -> str:
    """a / b to 3 places; "n/a" where b is 0 (at a few tokens the RSS above the inputs does not
    move: the process's peak was set before the loss ran)."""
    return f"{a / b:.3f}" if b else "n/a"


def _ratios(n, res) -> None:
    c = res.get(("chunked", n))
    for peer in ("naive", "torch"):
        p = res.get((peer, n))
        if not (c and p):
            continue
        above = _ratio(c["rss_mb"] - c["rss_inputs_mb"], p["rss_mb"] - p["rss_inputs_mb"])
        print(f"  T={n}: chunked/{peer:5s}  peak RSS {_ratio(c['rss_mb'], p['rss_mb'])}  "
              f"RSS above inputs {above}  time {_ratio(c['secs'], p['secs'])}")  # fmt: skip


def memory_table(args) -> None:
    print("compiled temp (compile-only memory analysis, nothing runs):")
    for n in args.mem_tokens:
        c = compiled_temp_mb("chunked", n, args.block_size, args.vocab_tile)
        nv = compiled_temp_mb("naive", n, args.block_size, args.vocab_tile)
        print(f"  T={n:6d}  chunked {c:9.1f} MB  naive {nv:10.1f} MB  "
              f"chunked/naive {c / nv:.4f} (1/{nv / c:.1f})", flush=True)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mem-tokens", type=int, nargs="+", default=[2048, 4096, 16384])
    p.add_argument("--tokens", type=int, nargs="+", default=[2048], help="timed runs")
    p.add_argument("--big", type=int, default=16384, help="tokens for the chunked-only timed run")
    p.add_argument("--time-big", action="store_true", help="also time chunked at --big tokens")
    p.add_argument("--no-time", action="store_true", help="compiled memory only")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--vocab-tile", type=int, default=8192)
    p.add_argument("--impls", nargs="+", default=["chunked", "naive", "torch"])
    p.add_argument("--one", choices=["chunked", "naive", "torch"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        return _child(args)
    print(header("loss_memory"))
    print(f"D={D} V={V} fp32, T(emp)={TEMPERATURE}, block_size={args.block_size}, "
          f"vocab_tile={args.vocab_tile}, reps={args.reps} (best of), cpus={os.cpu_count()}")  # fmt: skip
    memory_table(args)
    if args.no_time:
        return
    res = {}
    cases = [(impl, n) for n in args.tokens for impl in args.impls]
    if args.time_big:
        cases.append(("chunked", args.big))
    for impl, n in cases:
        r = _spawn(impl, n, args)
        if r:
            res[(impl, n)] = r
            print(_row(impl, n, r), flush=True)
    print("timed-run ratios (chunked over peer; lower is better):")
    for n in args.tokens:
        _ratios(n, res)


if __name__ == "__main__":
    main()
