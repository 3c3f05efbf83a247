"""The model's shape and numerics, as one frozen, validated dataclass.

One decoder covers Qwen2/Qwen2.5, Qwen3 and Llama; the family (a record of `models/families.py`)
only sets defaults for the two switches that differ between them (`qkv_bias`, `qk_norm`) and its
own config.json keys, so no code branches on a family name. `from_hf_config` / `to_hf_config` translate to and from a Hugging Face `config.json` dict.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dynamo_jax import validate
from dynamo_jax.models import families

DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = (
    "none",
    "full",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "everything_saveable",
)
# How the masked attention is computed (models/attention.py ATTENTION_IMPLS, same names).
ATTENTION_IMPLS = ("matmul", "xla", "cudnn", "blockwise", "pallas")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Qwen2/Qwen3/Llama decoder.

    `head_dim` defaults to hidden_size // num_heads (Qwen2); Qwen3 sets it explicitly and it may
    differ. `qkv_bias` / `qk_norm` default from `family`. `dtype` is the compute dtype, params are
    stored in `param_dtype`.
    """

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool | None = None
    qk_norm: bool | None = None
    max_position_embeddings: int = 32768
    dtype: str = "float32"
    param_dtype: str = "float32"
    scan_layers: bool = True
    remat_policy: str = "none"
    # "matmul": batched matmuls over (row, kv head), the fastest on XLA:CPU; "xla" / "cudnn":
    # jax.nn.dot_product_attention with that implementation (cudnn: fused flash attention on
    # NVIDIA GPUs, bf16/fp16 compute only). Same results up to rounding.
    # "blockwise": flash-style tiles of attention_block_q queries x attention_block_k keys with a
    # recomputing backward (models/attention_blockwise.py), memory linear in length, any backend;
    # "pallas": the Pallas GPU flash kernel with segment ids (NVIDIA GPUs only; training rows,
    # decoding falls back to "blockwise").
    attention_impl: str = "matmul"
    attention_block_q: int = 512
    attention_block_k: int = 512

    def __post_init__(self):
        validate.one_of("ModelConfig", "family", self.family, families.names())
        family = families.get(self.family)
        for name in ("qkv_bias", "qk_norm"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(family, name))
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"ModelConfig.head_dim is unset and hidden_size {self.hidden_size} is not "
                    f"divisible by num_heads {self.num_heads}"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
            "attention_block_q",
            "attention_block_k",
        ):
            validate.positive_ints("ModelConfig", self, name)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads}) for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        validate.positive("ModelConfig", self, "rope_theta", "rms_norm_eps")
        validate.one_of("ModelConfig", "dtype", self.dtype, DTYPES)
        validate.one_of("ModelConfig", "param_dtype", self.param_dtype, DTYPES)
        validate.one_of("ModelConfig", "attention_impl", self.attention_impl, ATTENTION_IMPLS)
        if self.attention_impl == "cudnn" and self.dtype != "bfloat16":
            raise ValueError(
                "ModelConfig.attention_impl='cudnn' (fused flash attention) needs "
                f"dtype='bfloat16', got {self.dtype!r}"
            )
        validate.one_of("ModelConfig", "remat_policy", self.remat_policy, REMAT_POLICIES)

    @property
    def num_params(self) -> int:
        """Parameter count from shapes alone (no allocation); tied embeddings count once."""
        d, f, hd = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_heads * hd, self.num_kv_heads * hd
        attn = d * q + 2 * d * kv + q * d
        if self.qkv_bias:
            attn += q + 2 * kv
        if self.qk_norm:
            attn += 2 * hd
        layer = attn + 3 * d * f + 2 * d
        embed = self.vocab_size * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return embed + self.num_layers * layer + d + head

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], **overrides: Any) -> ModelConfig:
        """Build from a Hugging Face `config.json` dict (transformers 4.x or 5.x spelling).

        `overrides` set the fields HF does not describe (dtype, scan_layers, remat_policy, ...).
        """
        model_type = hf.get("model_type")
        if not (isinstance(model_type, str) and model_type in families.FAMILIES):
            raise ValueError(
                f"unsupported model_type {model_type!r} in config.json; "
                f"supported: {families.names()}"
            )
        family = families.get(model_type)
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"):
            if key not in hf:
                raise ValueError(f"config.json (model_type {model_type}) is missing {key!r}")
        if hf.get("use_sliding_window", False):
            raise ValueError("config.json sets use_sliding_window=true, which is not supported")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json hidden_act {hf['hidden_act']!r} unsupported (need silu)")
        rope_theta = _rope_theta(hf)
        num_heads = hf["num_attention_heads"]
        fields: dict[str, Any] = dict(
            family=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim"),
            rope_theta=float(rope_theta),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=hf.get("max_position_embeddings", 32768),
        )
        fields.update(family.read_hf(hf))
        fields.update(overrides)
        return cls(**fields)

    def to_hf_config(self, *, dtype: str | None = None) -> dict[str, Any]:
        """A `config.json` dict that transformers' AutoConfig reads back into this shape."""
        family = families.get(self.family)
        if family.export_qkv_bias is not None and self.qkv_bias != family.export_qkv_bias:
            raise ValueError(family.export_qkv_bias_error)
        if self.qk_norm != family.qk_norm:
            raise ValueError(
                f"qk_norm={self.qk_norm} cannot be expressed as a {self.family} checkpoint"
            )
        hf: dict[str, Any] = {
            "architectures": [family.architecture],
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            # Both spellings: transformers 5 reads rope_parameters, older readers rope_theta.
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "use_sliding_window": False,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": True,
            "dtype": dtype or self.param_dtype,
        }
        family.write_hf(self, hf)
        return hf


def _rope_theta(hf: dict[str, Any]) -> float:
    """RoPE base from `rope_parameters` (transformers 5) or `rope_theta` (older files)."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"config.json rope_type {rope_type!r} is unsupported (only 'default')")
    if "rope_theta" in params:
        return params["rope_theta"]
    return hf.get("rope_theta", 10000.0)
