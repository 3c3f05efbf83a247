"""Rollout throughput: the embedded JAX engine vs transformers `generate` (PyTorch), on CPU.

Both sides get the same random weights (the JAX parameters are converted from the torch
model's state dict), the same prompts (mixed lengths), the same number of samples per prompt,
the same number of new tokens (no stop token, so every sample is exactly `max_new` long), and
plain sampling at temperature 1 (top-k / top-p off). Compilation / warm-up is excluded on both
sides and reported separately. Prints generated tokens/s of each and the ratio.

Run (about 2 minutes on 2 CPU cores):
    python benchmarks/sampler.py
    python benchmarks/sampler.py --models tiny --max-new 64 --torch-threads 1
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from dynamo_jax.models.config import ModelConfig  # noqa: E402
from dynamo_jax.models.hf_io import from_hf_tensors  # noqa: E402
from dynamo_jax.rollout.jax_engine import JaxEngine, JaxEngineConfig  # noqa: E402
from dynamo_jax.rollout.protocol import Request, SamplingParams  # noqa: E402

# name -> (transformers Qwen2Config kwargs, prompts, samples per prompt)
MODELS = {
    "tiny": (
        dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
        ),
        16,
        4,
    ),
    # Qwen2.5-0.5B's widths, vocabulary and tying, with 2 of its 24 layers.
    "qwen2.5-0.5b-2layer": (
        dict(
            vocab_size=151936,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=2,
            num_attention_heads=14,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        ),
        8,
        4,
    ),
}


def build(name: str):
    kwargs, n_prompts, n = MODELS[name]
    hf_cfg = transformers.Qwen2Config(
        **kwargs,
        max_position_embeddings=4096,
        rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
    )
    torch.manual_seed(0)
    hf = transformers.Qwen2ForCausalLM(hf_cfg).float().eval()
    with torch.no_grad():  # O(1) logits, like a trained model's, instead of near-uniform ones
        for p in hf.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
    cfg = ModelConfig.from_hf_config(hf_cfg.to_dict())
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    params = from_hf_tensors(state, cfg)
    return hf, cfg, params, n_prompts, n


def prompts_for(vocab: int, n_prompts: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, vocab, size=int(rng.integers(16, 64))).tolist() for _ in range(n_prompts)
    ]


def run_jax(engine: JaxEngine, prompts, n: int, max_new: int, seed: int) -> tuple[float, int]:
    reqs = [Request(i, tuple(p), n) for i, p in enumerate(prompts)]
    sp = SamplingParams(max_new_tokens=max_new, temperature=1.0, seed=seed)
    t0 = time.perf_counter()
    out = engine.generate(reqs, sp)
    return time.perf_counter() - t0, sum(len(c.token_ids) for c in out)


def run_hf(hf, prompts, n: int, max_new: int, seed: int) -> tuple[float, int]:
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding, as decoder-only generation requires
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            num_return_sequences=n,
            max_new_tokens=max_new,
            min_new_tokens=max_new,
            eos_token_id=None,
            pad_token_id=0,
        )
    elapsed = time.perf_counter() - t0
    return elapsed, int(out[:, width:].numel())


def bench(name: str, max_new: int, repeats: int) -> None:
    hf, cfg, params, n_prompts, n = build(name)
    prompts = prompts_for(cfg.vocab_size, n_prompts)
    engine = JaxEngine(cfg, params, JaxEngineConfig())
    t_compile, _ = run_jax(engine, prompts, n, max_new, seed=1)  # compiles
    run_hf(hf, prompts[:2], 1, 4, seed=1)  # warm-up
    # Best of `repeats` on each side: on a shared machine the minimum is the least-disturbed run.
    t_jax, tok_jax = min(run_jax(engine, prompts, n, max_new, seed=2 + r) for r in range(repeats))
    t_hf, tok_hf = min(run_hf(hf, prompts, n, max_new, seed=2 + r) for r in range(repeats))
    jax_tps, hf_tps = tok_jax / t_jax, tok_hf / t_hf
    print(
        f"{name}: {n_prompts} prompts x n={n}, {max_new} new tokens, vocab {cfg.vocab_size}, "
        f"best of {repeats} | jax engine {jax_tps:,.0f} tok/s ({t_jax:.2f} s; first call incl. "
        f"compile {t_compile:.1f} s, {engine.num_compilations} programs) | transformers generate "
        f"{hf_tps:,.0f} tok/s ({t_hf:.2f} s) | ratio {jax_tps / hf_tps:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per side (best kept)")
    parser.add_argument(
        "--torch-threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)"
    )
    args = parser.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), transformers {transformers.__version__}"
    )
    for name in args.models:
        bench(name, args.max_new, args.repeats)


if __name__ == "__main__":
    main()
