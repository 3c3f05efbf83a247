"""Flax Qwen forward and KV-cache greedy decoding vs transformers (PyTorch), same weights.

Peer: transformers' Qwen3ForCausalLM on the same device (CPU here): `model(...)` for the full
forward and `generate(do_sample=False, use_cache=True)` for decoding. Both sides use the same
random weights (exported with `to_hf_tensors`), so the benchmark also checks that the greedy
tokens agree. Printed: seconds per call (best of --repeats, after a warm-up/compile call) and
the ratio torch_time / jax_time (> 1 means the Flax model is faster).

Default shape: Qwen3-0.6B widths (hidden 1024, 16/8 heads, head_dim 128, mlp 3072, vocab
151,936) with --layers 2, batch 4, prompt 64, 32 new tokens, fp32.

    python -m benchmarks.models_decode [--layers 2] [--batch 4] [--prompt 64] [--new 32] [--repeats 3]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from benchmarks.harness import header, time_calls
from dynamo_jax.models import decode, hf_io, qwen
from dynamo_jax.models.presets import get_preset


def _best(fn, repeats: int) -> float:
    """Best-of-`repeats` seconds of `fn` after one warm-up (compiling) call."""
    return time_calls(fn, repeats=repeats, warmup=1).min


def _torch_model(params, cfg):
    hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf_config())
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32).eval()
    state = {k: torch.from_numpy(np.array(v)) for k, v in hf_io.to_hf_tensors(params, cfg).items()}
    model.load_state_dict(state, strict=False)  # tied: lm_head comes from the embedding
    model.tie_weights()
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(header(f"models_decode: {args.layers} layers, best of {args.repeats}"))

    cfg = get_preset("qwen3-0.6b", num_layers=args.layers)
    params = qwen.init_params(cfg, jax.random.key(0))
    params = jax.tree.map(lambda x: x * 5 if x.ndim > 1 else x, params)  # non-flat logits
    model = _torch_model(params, cfg)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (args.batch, args.prompt)).astype(np.int32)
    mask = np.ones_like(tokens)
    pos = qwen.positions_from_mask(mask)
    t_tokens = torch.from_numpy(tokens.astype(np.int64))

    def jax_forward():
        return qwen.forward_jit(params, cfg, tokens, pos, mask)

    def torch_forward():
        with torch.no_grad():
            model(input_ids=t_tokens)

    def jax_decode():
        return np.asarray(
            decode.greedy_generate(params, cfg, jnp.asarray(tokens), jnp.asarray(mask), args.new)
        )

    def torch_decode():
        with torch.no_grad():
            out = model.generate(
                input_ids=t_tokens,
                attention_mask=torch.ones_like(t_tokens),
                max_new_tokens=args.new,
                min_new_tokens=args.new,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
            )
        return out[:, args.prompt :].numpy()

    same = np.array_equal(jax_decode(), torch_decode())
    print(
        f"model: Qwen3-0.6B widths, {args.layers} layers ({cfg.num_params:,} params), fp32, "
        f"batch {args.batch}, prompt {args.prompt}, new {args.new}, device {jax.devices()[0].platform}"
    )
    print(f"greedy tokens identical (jax vs torch): {same}")
    for name, jax_fn, torch_fn in (
        ("forward", jax_forward, torch_forward),
        ("greedy decode", jax_decode, torch_decode),
    ):
        tj, tt = _best(jax_fn, args.repeats), _best(torch_fn, args.repeats)
        print(f"{name:14s} jax {tj:.3f} s  torch {tt:.3f} s  ratio torch/jax = {tt / tj:.2f}")


if __name__ == "__main__":
    main()
