"""Where a decode step's time goes on CPU: cache size, dense matmuls, and HF transformers beside it.

    python -m benchmarks.decode_profile                           # small-qwen3, 128 rows, 1 thread
    python -m benchmarks.decode_profile --preset smollm2-135m --vocab 0 --slots 80

One decode step of `models/decode.decode_step` (the step the embedded engine's decode program
loops over), timed inside a `fori_loop` of `--steps` steps like the engine runs it, for each
`--slots` KV-cache size (prompt 16 + the rest generated) and both layer layouts
(`scan_layers` True, the presets' default, and False). Beside it, at the same rows:
- "dense matmuls only": the step's q/k/v/o, MLP and unembedding matmuls alone (no attention, no
  cache, no norms), the FLOPs floor of the step on this machine;
- HF transformers' decode step (torch, the same shape, `DynamicCache`), what TRL generates with.

A step whose time grows with the cache much faster than the attention's reads of it is copying
the cache: that is what this prints. Single-threaded by default (`--threads 1` pins nothing; run
it under `taskset -c N` for a quiet core).
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.harness import header, pin_threads, time_calls


def _median_seconds(fn, *args, repeats: int) -> float:
    """Median seconds of `fn(*args)` after one compiling call."""
    return time_calls(lambda: fn(*args), repeats=repeats, warmup=1).median


def jax_rows(preset: str, vocab: int, rows: int, slots: list[int], steps: int, repeats: int):
    """[(label, seconds per step)] of the project's decode step and its dense matmuls."""
    import jax
    import jax.numpy as jnp

    from dynamo_jax.models import qwen
    from dynamo_jax.models.decode import decode_step, init_cache, prefill
    from dynamo_jax.models.presets import get_preset

    out = []
    prompt = 16
    for scan in (True, False):
        overrides = {"scan_layers": scan, **({"vocab_size": vocab} if vocab else {})}
        cfg = get_preset(preset, **overrides)
        params = qwen.init_params(cfg, jax.random.key(0))
        tokens = jnp.ones((rows, prompt), jnp.int32)
        for total in slots:
            cache = init_cache(cfg, rows, total)
            _, cache = jax.jit(prefill, static_argnums=1)(params, cfg, tokens, tokens, cache)

            def loop(params, cache, tok_B, cfg=cfg):
                params, cfg = qwen.unrolled_layers(params, cfg)  # once, as the engine does

                def body(_, carry):
                    cache, tok_B = carry
                    logits_BxV, cache = decode_step(params, cfg, tok_B, cache)
                    return cache, jnp.argmax(logits_BxV, -1).astype(jnp.int32)

                return jax.lax.fori_loop(0, steps, body, (cache, tok_B))

            seconds = _median_seconds(jax.jit(loop), params, cache, tokens[:, 0], repeats=repeats)
            kv_mib = 2 * cfg.num_layers * rows * total * cfg.num_kv_heads * cfg.head_dim * 4 / 2**20
            out.append((f"decode step, scan_layers={scan}, {total} slots ({kv_mib:.1f} MiB k+v)",
                        seconds / steps))  # fmt: skip
    for total in slots:
        out += _cache_parts(cfg, rows, total, steps, repeats)
    d, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    qkv = cfg.num_heads * cfg.head_dim + 2 * cfg.num_kv_heads * cfg.head_dim
    shapes = [(d, qkv), (cfg.num_heads * cfg.head_dim, d), (d, f), (d, f), (f, d)]
    weights = [jnp.full(s, 1e-3, jnp.float32) for s in shapes]

    def dense(x_BxD, weights):
        for _ in range(cfg.num_layers):
            wqkv, wo, wg, wu, wd = weights
            x_BxD = x_BxD + (x_BxD @ wqkv)[:, : wo.shape[0]] @ wo
            x_BxD = x_BxD + ((x_BxD @ wg) * (x_BxD @ wu)) @ wd
        return x_BxD @ jnp.full((d, v), 1e-3, jnp.float32)

    x = jnp.ones((rows, d), jnp.float32)
    out.append(("dense matmuls only", _median_seconds(jax.jit(dense), x, weights, repeats=20)))
    return cfg, out


def _cache_parts(cfg, rows: int, total: int, steps: int, repeats: int):
    """The step's two cache-sized parts alone, all layers, per step: attention over the cache
    (`models/attention.attend_kv_major`, the cache's own layout) and the cache write, each layer's
    new slot written in place into its own arrays as `Transformer.extend` does; beside them the
    earlier stacked [Ly, B, S, K, E] cache, sliced per layer then stacked again, which copied
    the whole cache every token."""
    import jax
    import jax.numpy as jnp

    from dynamo_jax.models.attention import attend_kv_major

    layers, kv, e = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
    k_cache = tuple(jnp.zeros((rows, kv, e, total)) for _ in range(layers))
    v_cache = tuple(jnp.zeros((rows, kv, total, e)) for _ in range(layers))
    q_Bx1xHxE = jnp.ones((rows, 1, cfg.num_heads, e))
    allowed_Bx1xS = jnp.ones((rows, 1, total), bool)

    def attention(k_cache, v_cache, q):
        def body(_, acc):
            for layer in range(layers):
                acc = acc + attend_kv_major(q + acc, k_cache[layer], v_cache[layer], allowed_Bx1xS)
            return acc

        return jax.lax.fori_loop(0, steps, body, jnp.zeros_like(q))

    def in_place(k_cache, v_cache, new):
        def body(i, caches):
            ks, vs = caches
            ks = tuple(
                jax.lax.dynamic_update_slice(k, (new + i)[..., None], (0, 0, 0, i)) for k in ks
            )
            vs = tuple(
                jax.lax.dynamic_update_slice(v, (new + i)[:, :, None], (0, 0, i, 0)) for v in vs
            )
            return ks, vs

        return jax.lax.fori_loop(0, steps, body, (k_cache, v_cache))

    def restacked(k_all, v_all, new):
        def body(i, caches):
            k_all, v_all = caches
            start = (0, i, 0, 0)
            ks = [jax.lax.dynamic_update_slice(k_all[j], new + i, start) for j in range(layers)]
            vs = [jax.lax.dynamic_update_slice(v_all[j], new + i, start) for j in range(layers)]
            return jnp.stack(ks), jnp.stack(vs)

        return jax.lax.fori_loop(0, steps, body, (k_all, v_all))

    stacked = jnp.zeros((layers, rows, total, kv, e))
    parts = (
        ("attention over the cache only", attention, (k_cache, v_cache, q_Bx1xHxE)),
        (
            "cache write in place, per-layer arrays",
            in_place,
            (k_cache, v_cache, jnp.ones((rows, kv, e))),
        ),
        (
            "(before: stacked cache sliced, written, stacked)",
            restacked,
            (stacked, stacked, jnp.ones((rows, 1, kv, e))),
        ),
    )
    return [
        (f"  {label}, {total} slots",
         _median_seconds(jax.jit(fn), *inputs, repeats=repeats) / steps)
        for label, fn, inputs in parts
    ]  # fmt: skip


def torch_row(cfg, rows: int, slots: int, threads: int) -> float:
    """HF transformers' median decode-step seconds at the same shape (a random model)."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    family = transformers.Qwen3Config if cfg.qk_norm else transformers.LlamaConfig
    hf = family(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, tie_word_embeddings=cfg.tie_word_embeddings,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(hf).eval()
    times = []
    with torch.no_grad():
        out = model(torch.ones((rows, 16), dtype=torch.long), use_cache=True)
        cache = out.past_key_values
        tok = torch.ones((rows, 1), dtype=torch.long)
        for _ in range(slots - 16):
            start = time.perf_counter()
            out = model(tok, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - start)
            cache = out.past_key_values
    return statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small-qwen3")
    parser.add_argument("--vocab", type=int, default=32, help="0 = the preset's vocabulary")
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--slots", default="48,128,256", help="cache sizes (prompt 16 + new)")
    parser.add_argument("--steps", type=int, default=16, help="decode steps per timed loop")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-torch", dest="torch", action="store_false")
    args = parser.parse_args()
    pin_threads(args.threads)  # before JAX starts
    print(header(f"decode_profile: {args.preset} (vocab {args.vocab or 'preset'}), "
                 f"{args.rows} rows, {args.threads} thread(s), medians of {args.repeats}"))  # fmt: skip
    slots = [int(s) for s in args.slots.split(",")]
    if min(slots) < 16 + args.steps:  # the timed loop writes --steps tokens after the prompt
        parser.error(f"--slots must each be at least 16 + --steps = {16 + args.steps}")
    cfg, rows = jax_rows(args.preset, args.vocab, args.rows, slots, args.steps, args.repeats)
    if args.torch:
        rows.append((f"HF transformers decode step, {slots[0]} slots",
                     torch_row(cfg, args.rows, slots[0], args.threads)))  # fmt: skip
    for label, seconds in rows:
        print(f"  {label:60s} {seconds * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
