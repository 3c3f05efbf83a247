"""Model smoke run: greedy-decode a chat prompt with the KV cache and print what came out.

    python -m dynamo_jax.models.smoke                       # tiny random model + tiny tokenizer
    python -m dynamo_jax.models.smoke --hf_dir PATH         # a local HF checkpoint and its tokenizer
    python -m dynamo_jax.models.smoke --hf_dir PATH --dtype bfloat16 --prompt "What is 7*6?"

With random weights the text is gibberish; the run checks that everything wires together.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from dynamo_jax.models import decode, hf_io, qwen, tokenizer
from dynamo_jax.models.presets import get_preset


def _tiny_model_and_tokenizer(preset: str, seed: int):
    corpus = [f"Question: what is {a} + {b}? Answer: {a + b}" for a in range(40) for b in range(40)]
    tok = tokenizer.make_tiny_tokenizer(corpus, vocab_size=384)
    cfg = get_preset(preset)
    return cfg, qwen.init_params(cfg, jax.random.key(seed)), tok


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hf_dir", default=None, help="local HF model directory (config + safetensors + tokenizer)"
    )
    parser.add_argument(
        "--preset", default="tiny-qwen3", help="preset used when --hf_dir is not given"
    )
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="compute dtype"
    )
    parser.add_argument("--prompt", default="What is 3 + 4?")
    parser.add_argument("--max_new_tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if args.hf_dir:
        cfg, params = hf_io.load_hf_checkpoint(args.hf_dir)
        tok = tokenizer.load_tokenizer(args.hf_dir)
    else:
        cfg, params, tok = _tiny_model_and_tokenizer(args.preset, args.seed)
    cfg = cfg.replace(dtype=args.dtype)
    tokenizer.check_tokenizer_fits(tok, cfg)
    ids = tokenizer.encode_chat(tok, [{"role": "user", "content": args.prompt}])
    tokens = jnp.asarray([ids], jnp.int32)
    start = time.perf_counter()
    out = decode.greedy_generate(params, cfg, tokens, jnp.ones_like(tokens), args.max_new_tokens)
    out = np.asarray(out)[0]
    seconds = time.perf_counter() - start
    text = tok.decode(out.tolist())
    print(
        f"model: {cfg.family} {cfg.num_params:,} params, dtype {cfg.dtype}; tokenizer: {tokenizer.describe(tok)}"
    )
    print(f"prompt ids ({len(ids)}): {ids}")
    print(f"generated ids: {out.tolist()}")
    print(f"generated text: {text!r}")
    print(f"{args.max_new_tokens} tokens in {seconds:.2f} s (including compilation)")
    return text


if __name__ == "__main__":
    main()
