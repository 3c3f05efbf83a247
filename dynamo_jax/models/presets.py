"""Named model shapes: the published Qwen checkpoints used by DynaMO/E3, SmolLM2-135M (Llama), and
tiny CPU models.

The full-size entries copy the official `config.json` shapes (hidden/intermediate sizes, layer and
head counts, vocab, RoPE base, RMSNorm epsilon, tying); `PUBLISHED_NUM_PARAMS` holds the counts
published for them, which tests compare against `ModelConfig.num_params`.
"""

from __future__ import annotations

from typing import Any

from dynamo_jax.models.config import ModelConfig


def _qwen2(**kw: Any) -> ModelConfig:
    base = dict(family="qwen2", rms_norm_eps=1e-6)
    return ModelConfig(**{**base, **kw})


def _qwen3(**kw: Any) -> ModelConfig:
    base = dict(
        family="qwen3",
        vocab_size=151936,
        head_dim=128,
        num_kv_heads=8,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=40960,
    )
    return ModelConfig(**{**base, **kw})


def _llama(**kw: Any) -> ModelConfig:
    base = dict(family="llama", rms_norm_eps=1e-5)
    return ModelConfig(**{**base, **kw})


# Qwen2.5-Math-1.5B and DeepSeek-R1-Distill-Qwen-1.5B share shapes; the distill unties lm_head.
_QWEN25_15B = dict(
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_layers=28,
    num_heads=12,
    num_kv_heads=2,
    rope_theta=10000.0,
)
_QWEN25_7B = dict(
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_layers=28,
    num_heads=28,
    num_kv_heads=4,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)

PRESETS: dict[str, ModelConfig] = {
    "qwen2.5-math-1.5b": _qwen2(
        **_QWEN25_15B, tie_word_embeddings=True, max_position_embeddings=4096
    ),
    "qwen2.5-math-7b": _qwen2(**_QWEN25_7B, max_position_embeddings=4096),
    "qwen2.5-0.5b": _qwen2(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    ),
    "r1-distill-qwen-1.5b": _qwen2(
        **_QWEN25_15B, tie_word_embeddings=False, max_position_embeddings=131072
    ),
    "r1-distill-qwen-7b": _qwen2(**_QWEN25_7B, max_position_embeddings=131072),
    "qwen3-0.6b": _qwen3(
        hidden_size=1024,
        intermediate_size=3072,
        num_layers=28,
        num_heads=16,
        tie_word_embeddings=True,
    ),
    "qwen3-1.7b": _qwen3(
        hidden_size=2048,
        intermediate_size=6144,
        num_layers=28,
        num_heads=16,
        tie_word_embeddings=True,
    ),
    "qwen3-8b": _qwen3(
        hidden_size=4096,
        intermediate_size=12288,
        num_layers=36,
        num_heads=32,
        tie_word_embeddings=False,
    ),
    "qwen3-14b": _qwen3(
        hidden_size=5120,
        intermediate_size=17408,
        num_layers=40,
        num_heads=40,
        tie_word_embeddings=False,
    ),
    # HuggingFaceTB/SmolLM2-135M(-Instruct): the real model configs/smollm2_arith.py trains.
    "smollm2-135m": _llama(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    ),
    # Tiny models for tests and the CPU default. vocab 512 leaves room for a small BPE tokenizer
    # plus the chat special tokens; head_dim 32 differs from hidden/heads (64/4 = 16) in Qwen3
    # on purpose, as in the real Qwen3 models.
    "tiny-qwen3": _qwen3(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    ),
    "tiny-qwen2": _qwen2(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        max_position_embeddings=2048,
    ),
    "tiny-llama": _llama(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    ),
    # A little larger, still CPU-friendly: for short end-to-end runs that should learn something.
    "small-qwen3": _qwen3(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=768,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    ),
}

# Counts published on the model cards (Qwen2.5-Math-7B shares Qwen2.5-7B's 7.62B; the
# R1-distill models are counted from their official config shapes, see the test).
PUBLISHED_NUM_PARAMS: dict[str, int] = {
    "qwen2.5-math-1.5b": 1_543_714_304,
    "qwen2.5-math-7b": 7_615_616_512,
    "qwen2.5-0.5b": 494_032_768,
    "qwen3-0.6b": 596_049_920,
    "qwen3-1.7b": 2_031_739_904,
    "qwen3-8b": 8_190_735_360,
    "qwen3-14b": 14_768_307_200,
    "smollm2-135m": 134_515_008,
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """The preset `name`, with optional field overrides (e.g. dtype="bfloat16", scan_layers=False)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    cfg = PRESETS[name]
    return cfg.replace(**overrides) if overrides else cfg
