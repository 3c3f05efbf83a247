"""Frozen, validated configs of the rollout side: which engine generates, and the embedded engine.

`RolloutConfig` is the `rollout` section of a run config (which engine, response length, nucleus
/ top-k, the vLLM sidecar's settings); `JaxEngineConfig` is the `jax_engine` section (the
embedded sampler's bucketing). The sampling temperature comes from the `temperature` section.
"""

from __future__ import annotations

import dataclasses

ENGINES = ("jax", "vllm")
VLLM_DTYPES = ("float32", "bfloat16", "float16")
CACHE_DTYPES = ("float32", "bfloat16")


def _positive(section: str, obj, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not value > 0:
            raise ValueError(f"{section}.{name} must be > 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Which engine generates, and how (temperature comes from the temperature section)."""

    engine: str = "jax"  # "jax" (in-process sampler) or "vllm" (sidecar process)
    max_new_tokens: int = 64  # response length limit
    top_p: float = 1.0  # nucleus sampling during training (1.0 = off, as in both papers)
    top_k: int = -1  # top-k sampling (-1 = off)
    sidecar_python: str = ".venv-vllm/bin/python"  # vllm: interpreter of the vLLM venv
    vllm_dtype: str = "bfloat16"  # vllm: weights/compute dtype (float32|bfloat16|float16)
    gpu_memory_utilization: float = 0.4  # vllm: share of accelerator memory vLLM may take
    vllm_enforce_eager: bool = False  # vllm: skip CUDA graphs (faster start, slower decode)
    vllm_max_num_seqs: int = 256  # vllm: concurrent sequences

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise ValueError(f"rollout.engine must be one of {ENGINES}, got {self.engine!r}")
        _positive("rollout", self, "max_new_tokens", "top_p", "gpu_memory_utilization")
        if self.top_p > 1.0:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.gpu_memory_utilization > 1.0:
            raise ValueError(
                f"rollout.gpu_memory_utilization must be in (0, 1], got "
                f"{self.gpu_memory_utilization}"
            )
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"rollout.top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.vllm_dtype not in VLLM_DTYPES:
            raise ValueError(
                f"rollout.vllm_dtype must be one of {VLLM_DTYPES}, got {self.vllm_dtype!r}"
            )


@dataclasses.dataclass(frozen=True)
class JaxEngineConfig:
    """Bucketing and loop settings of the embedded engine (rollout/jax_engine.py)."""

    min_batch: int = 8  # smallest batch bucket
    max_batch: int = 256  # most rows one program runs (larger calls are split)
    min_prompt_len: int = 16  # floor of the prompt-length buckets
    min_new_tokens: int = 16  # floor of the generation-length buckets
    decode_chunk: int = 32  # decode steps per program call between host checks
    compact: bool = True  # gather live rows into a smaller bucket when at most half are running
    cache_dtype: str | None = None  # KV-cache dtype (None = the model's compute dtype)

    def __post_init__(self):
        for name in ("min_batch", "max_batch", "min_prompt_len", "min_new_tokens", "decode_chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"JaxEngineConfig.{name} must be a positive int, got {value!r}")
        if self.max_batch < self.min_batch:
            raise ValueError(
                f"JaxEngineConfig.max_batch ({self.max_batch}) must be >= min_batch "
                f"({self.min_batch})"
            )
        if self.cache_dtype is not None and self.cache_dtype not in CACHE_DTYPES:
            raise ValueError(
                f"JaxEngineConfig.cache_dtype must be None or one of {CACHE_DTYPES}, got "
                f"{self.cache_dtype!r}"
            )
