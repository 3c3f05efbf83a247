"""Tiny random Hugging Face Qwen2/Qwen3/Llama checkpoints for tests (built offline, in milliseconds).

Every weight is re-drawn so that no parameter is trivially 0 or 1 (HF initialises biases to 0
and norm weights to 1, which would hide a swapped or dropped tensor), and scaled so logits are
O(1-10) rather than ~0 (a parity tolerance means nothing on near-zero logits).
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from transformers.initialization import no_init_weights


def make_tiny_hf_model(
    family: str = "qwen3",
    *,
    tie: bool = True,
    head_dim: int | None = None,
    vocab: int = 256,
    layers: int = 2,
    hidden: int = 64,
    intermediate: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    rope_theta: float = 10000.0,
    rms_norm_eps: float = 1e-6,
    seed: int = 0,
    **extra,
):
    """A randomised transformers Qwen2/Qwen3/LlamaForCausalLM in float32, eval mode."""
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        rope_parameters={"rope_theta": rope_theta, "rope_type": "default"},
        rms_norm_eps=rms_norm_eps,
        tie_word_embeddings=tie,
        max_position_embeddings=512,
        **extra,
    )
    if family == "qwen3":
        config = transformers.Qwen3Config(head_dim=head_dim or 2 * hidden // heads, **common)
        model_cls = transformers.Qwen3ForCausalLM
    elif family == "qwen2":
        if head_dim not in (None, hidden // heads):
            raise ValueError("Qwen2 has head_dim = hidden // heads")
        config = transformers.Qwen2Config(**common)
        model_cls = transformers.Qwen2ForCausalLM
    elif family == "llama":
        config = transformers.LlamaConfig(head_dim=head_dim or hidden // heads, **common)
        model_cls = transformers.LlamaForCausalLM
    else:
        raise ValueError(f"unknown family {family!r}")
    # Every weight is overwritten below, so skip transformers' own (slow, at real widths) init.
    with no_init_weights():
        model = model_cls(config).float().eval()
    model.tie_weights()
    _randomize(model, seed)
    return model


@torch.no_grad()
def _randomize(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed + 1)
    for name, p in model.named_parameters():
        noise = _noise(p.shape, gen)
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.2 * noise)
        elif name.endswith(".bias"):
            p.copy_(0.5 * noise)
        elif "embed_tokens" in name:
            # Tied: these are also the output weights; 2/sqrt(D) gives logits of a few units,
            # like a trained model's, at any width (fp32 parity at 1e-4 needs |logits| ~< 30).
            p.copy_(2.0 * noise / p.shape[1] ** 0.5)
        else:  # [out, in] Linear: unit-variance activations stay unit-variance
            p.copy_(noise / p.shape[1] ** 0.5)


_BLOCK_ROWS = 4096


def _noise(shape, gen) -> torch.Tensor:
    """Standard normal noise; a real-width vocab (150k rows) reuses a 4096-row block, each row
    with its own random scale, which is ~10x cheaper to draw and still unique per row."""
    if len(shape) != 2 or shape[0] <= 4 * _BLOCK_ROWS:
        return torch.randn(shape, generator=gen)
    block = torch.randn((_BLOCK_ROWS, shape[1]), generator=gen)
    reps = -(-shape[0] // _BLOCK_ROWS)
    scale = 0.5 + torch.rand((shape[0], 1), generator=gen)
    return block.repeat(reps, 1)[: shape[0]] * scale


def make_tiny_hf_checkpoint(tmpdir, family: str = "qwen3", *, tie: bool = True, **kwargs) -> Path:
    """Save a randomised tiny model (config.json + model.safetensors) into tmpdir; return the dir.

    kwargs: head_dim, vocab, layers, hidden, intermediate, heads, kv_heads, rope_theta, seed, ...
    """
    path = Path(tmpdir) / f"tiny-{family}-{'tied' if tie else 'untied'}"
    make_tiny_hf_model(family, tie=tie, **kwargs).save_pretrained(path)
    return path


def hf_logits(model, tokens, mask):
    """transformers logits [B, L, V] (NumPy float32) with positions counted over real tokens."""
    import numpy as np

    tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
    mask = torch.as_tensor(np.asarray(mask), dtype=torch.long)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=tokens, attention_mask=mask, position_ids=positions)
    return out.logits.float().numpy()


def random_flax_params(cfg, seed: int = 0):
    """Random Flax parameters for `cfg` drawn on the host from shapes alone (nothing compiles).

    Scales as in `_randomize`: norms ~1 +- 0.2, biases ~0.5, kernels 0.1, embeddings 2/sqrt(D),
    so logits are O(1-10).
    """
    import jax
    import numpy as np

    from dynamo_jax.models.qwen import param_shapes

    rng = np.random.default_rng(seed)

    def draw(path, s):
        name = jax.tree_util.keystr(path)
        noise = rng.standard_normal(s.shape).astype(np.float32)
        if "scale" in name:
            return 1.0 + 0.2 * noise
        if "bias" in name:
            return 0.5 * noise
        if "embedding" in name:
            return 2.0 * noise / cfg.hidden_size**0.5
        return 0.1 * noise

    return jax.tree_util.tree_map_with_path(draw, param_shapes(cfg))
