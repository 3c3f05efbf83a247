"""The model families: one record each, holding everything that differs between them.

One decoder (`models/qwen.py`) runs every family; a family only fixes what its Hugging Face
checkpoints look like: the `architectures` / `model_type` names, whether attention has q/k/v
biases and a q/k RMSNorm, and the family's own `config.json` keys (read by
`ModelConfig.from_hf_config`, written by `to_hf_config`). `FAMILIES` is a
`dynamo_jax.registry.Registry` (the shape every extension point shares); no module compares a
family's name as a string; a new family is one more `register(ModelFamily(...))` (docs/design.md
says the rest).

This module imports nothing of the package but the generic registry, so `ModelConfig` can
validate names against it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from dynamo_jax.registry import Registry


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """One family: its HF names, its attention switches and its own config.json keys."""

    name: str  # `model_type` of its config.json, and `ModelConfig.family`
    architecture: str  # `architectures[0]` of its config.json
    qkv_bias: bool  # the default of ModelConfig.qkv_bias
    qk_norm: bool  # q/k RMSNorm: the default of ModelConfig.qk_norm, and all a checkpoint can hold
    # The one qkv_bias value a checkpoint of the family can hold, and the error otherwise;
    # None: either (written to its config.json by `write_hf`).
    export_qkv_bias: bool | None = None
    export_qkv_bias_error: str = ""
    # The family's own keys of a config.json: `read_hf(hf)` → extra ModelConfig fields (raises
    # ValueError on a key the decoder cannot run); `write_hf(cfg, hf)` adds/removes keys in place.
    read_hf: Callable[[dict[str, Any]], dict[str, Any]] = lambda hf: {}
    write_hf: Callable[[Any, dict[str, Any]], None] = lambda cfg, hf: None


def _qwen3_read(hf: dict[str, Any]) -> dict[str, Any]:
    return {"qkv_bias": bool(hf.get("attention_bias", False))}


def _qwen3_write(cfg: Any, hf: dict[str, Any]) -> None:
    hf["attention_bias"] = bool(cfg.qkv_bias)


def _llama_read(hf: dict[str, Any]) -> dict[str, Any]:
    # Llama's `attention_bias` also biases o_proj, which this decoder lacks.
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key, False):
            raise ValueError(f"config.json sets {key}=true, which is not supported")
    if hf.get("pretraining_tp", 1) != 1:
        raise ValueError("config.json sets pretraining_tp != 1, which is not supported")
    return {}


def _llama_write(cfg: Any, hf: dict[str, Any]) -> None:
    hf.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    del hf["use_sliding_window"]


# Qwen2 attention always has q/k/v biases and no q/k norm; Qwen3 the reverse (its biases
# optional); Llama has neither.
FAMILIES: Registry[ModelFamily] = Registry("model family")
for _family in (
    ModelFamily(
        "qwen2",
        "Qwen2ForCausalLM",
        qkv_bias=True,
        qk_norm=False,
        export_qkv_bias=True,
        export_qkv_bias_error=(
            "Qwen2 checkpoints always carry q/k/v biases; qkv_bias=False cannot be exported"
        ),
    ),
    ModelFamily(
        "qwen3",
        "Qwen3ForCausalLM",
        qkv_bias=False,
        qk_norm=True,
        read_hf=_qwen3_read,
        write_hf=_qwen3_write,
    ),
    ModelFamily(
        "llama",
        "LlamaForCausalLM",
        qkv_bias=False,
        qk_norm=False,
        export_qkv_bias=False,
        export_qkv_bias_error=(
            "Llama checkpoints have no q/k/v-only biases; qkv_bias=True cannot be exported"
        ),
        read_hf=_llama_read,
        write_hf=_llama_write,
    ),
):
    FAMILIES.register(_family)


# The table's own functions under the names every extension point's module exposes
# (register refuses a second entry under one name unless replace=True).
register, unregister, names, get = (
    FAMILIES.register,
    FAMILIES.unregister,
    FAMILIES.names,
    FAMILIES.get,
)
