"""Frozen, validated configs of the rollout side: which engine generates, and the embedded engine.

`RolloutConfig` is the `rollout` section of a run config (which engine, response length, nucleus
/ top-k, the vLLM sidecars' settings and placement, the accelerator-memory split between JAX and
vLLM); `JaxEngineConfig` is the `jax_engine` section (the embedded sampler's bucketing). The
sampling temperature comes from the `temperature` section.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from dynamo_jax import validate
from dynamo_jax.errors import ConfigError

ENGINES = ("jax", "vllm")
VLLM_DTYPES = ("float32", "bfloat16", "float16")
CACHE_DTYPES = ("float32", "bfloat16")
SLEEP_LEVELS = (0, 1, 2)
# JAX's and vLLM's shares of one device together must leave room for what neither pool counts:
# CUDA contexts, NCCL buffers, cuBLAS/cuDNN workspaces, fragmentation.
COLOCATED_MEMORY_LIMIT = 0.95
JAX_MEMORY_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"


_int = validate.int_at_least
_positive = validate.positive


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
    vllm_tensor_parallel: int = 1  # vllm: tensor_parallel_size, i.e. accelerators per sidecar
    sidecars_per_host: int | None = None  # vllm: None/0 = accelerators // tensor parallel (CPU: 1)
    sidecar_devices: tuple[int, ...] = ()  # vllm: accelerator ids for sidecars; () = all, colocated
    vllm_sleep_level: int = 0  # vllm: sleep after each generate (0 off, 1 offload, 2 drop; GPU)
    jax_memory_fraction: float | None = None  # JAX's device share; None: 0.95 - vLLM's if colocated
    call_timeout_s: float = 600.0  # vllm: a call unanswered this long means a hung sidecar
    # vllm: once a kind of call has answered, hung = unanswered for max(floor, factor x its
    # last answer), at most call_timeout_s (docs/vllm_sidecar.md#faults)
    call_timeout_factor: float = 10.0
    call_timeout_floor_s: float = 30.0
    max_restarts: int = 3  # vllm: restarts allowed per sidecar within restart_window_s
    restart_window_s: float = 3600.0  # vllm: the sliding window max_restarts is counted in

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
        _int("rollout", self, "vllm_tensor_parallel", 1)
        _int("rollout", self, "max_restarts", 0)
        if self.sidecars_per_host is not None:
            _int("rollout", self, "sidecars_per_host", 0)
        if self.vllm_sleep_level not in SLEEP_LEVELS:
            raise ValueError(
                f"rollout.vllm_sleep_level must be one of {SLEEP_LEVELS}, got "
                f"{self.vllm_sleep_level!r}"
            )
        _positive("rollout", self, "call_timeout_s", "restart_window_s", "call_timeout_factor")
        _positive("rollout", self, "call_timeout_floor_s")
        devices = tuple(self.sidecar_devices)
        if any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in devices) or len(
            set(devices)
        ) != len(devices):
            raise ValueError(
                f"rollout.sidecar_devices must be distinct accelerator ids >= 0, got {devices!r}"
            )
        object.__setattr__(self, "sidecar_devices", devices)
        share = self.jax_memory_fraction
        if share is not None and not 0.0 < share <= 1.0:
            raise ValueError(f"rollout.jax_memory_fraction must be in (0, 1], got {share!r}")
        if self.colocated and self.jax_memory_share + self.gpu_memory_utilization > (
            COLOCATED_MEMORY_LIMIT + 1e-9
        ):
            raise ValueError(
                f"rollout.jax_memory_fraction ({self.jax_memory_share:g}) + "
                f"rollout.gpu_memory_utilization ({self.gpu_memory_utilization:g}) = "
                f"{self.jax_memory_share + self.gpu_memory_utilization:g} of each device JAX and "
                f"the vLLM sidecars share (rollout.sidecar_devices=()); at most "
                f"{COLOCATED_MEMORY_LIMIT} fits"
            )

    @property
    def colocated(self) -> bool:
        """vLLM sidecars on the trainer's own accelerators (no sidecar_devices of their own)."""
        return self.engine == "vllm" and not self.sidecar_devices

    @property
    def jax_memory_share(self) -> float | None:
        """JAX's share of each accelerator's memory; None leaves JAX's own default."""
        if self.jax_memory_fraction is not None:
            return self.jax_memory_fraction
        if self.colocated:
            return round(COLOCATED_MEMORY_LIMIT - self.gpu_memory_utilization, 6)
        return None

    def jax_memory_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The environment JAX must start with (launch.py sets it before JAX's backend starts).

        A value already in `environ` that differs from the config's is an error: the memory
        split is checked from the config, so the two must agree.
        """
        share = self.jax_memory_share
        if share is None:
            return {}
        given = environ.get(JAX_MEMORY_ENV)
        if given is not None:
            try:
                same = abs(float(given) - share) < 1e-6
            except ValueError:
                same = False
            if not same:
                how = "" if self.jax_memory_fraction else " = 0.95 - rollout.gpu_memory_utilization"
                raise ConfigError(
                    f"{JAX_MEMORY_ENV}={given} in the environment contradicts "
                    f"rollout.jax_memory_fraction ({share:g}{how}); unset the variable or set "
                    f"the field to its value"
                )
        return {JAX_MEMORY_ENV: f"{share:g}"}

    def device_groups(self, trainer_devices: Sequence[str]) -> list[str]:
        """Each local sidecar's device group (its CUDA_VISIBLE_DEVICES), in sidecar order.

        `trainer_devices` are the accelerator ids the trainer's JAX uses on this host (empty on
        CPU, where the groups are nominal: vLLM's CPU build ignores them). Colocated sidecars
        share those; separate ones take `sidecar_devices`, which the trainer must not use.
        """
        tp = self.vllm_tensor_parallel
        if self.sidecar_devices:
            devices = [str(d) for d in self.sidecar_devices]
            shared = sorted(set(devices) & set(trainer_devices), key=devices.index)
            if shared:
                raise ConfigError(
                    f"rollout.sidecar_devices {list(self.sidecar_devices)} are for the sidecars "
                    f"alone, but the trainer's JAX also uses accelerator(s) {shared}: start the "
                    f"trainer with CUDA_VISIBLE_DEVICES set to the other ones"
                )
        else:
            devices = list(trainer_devices)
        if not devices:  # CPU: nominal groups, one sidecar unless asked otherwise
            if self.vllm_sleep_level:
                raise ConfigError(
                    "rollout.vllm_sleep_level needs GPUs: vLLM has no sleep mode on CPU"
                )
            count = self.sidecars_per_host or 1
            return [",".join(str(i * tp + j) for j in range(tp)) for i in range(count)]
        count = self.sidecars_per_host or len(devices) // tp
        if count < 1 or count * tp > len(devices):
            raise ConfigError(
                f"rollout.sidecars_per_host ({self.sidecars_per_host or 'auto'} -> {count}) x "
                f"rollout.vllm_tensor_parallel ({tp}) needs {max(count, 1) * tp} accelerators; "
                f"the sidecars have {len(devices)}: {devices}"
            )
        return [",".join(devices[i * tp : (i + 1) * tp]) for i in range(count)]


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
    # Devices of the engine's own data-parallel mesh: rows split over the first `devices` local
    # devices, weights replicated on each (copied there at every push); 0 = the trainer's mesh.
    # On CPU, with XLA's host device count set to the cores (docs/running.md), each device decodes
    # its rows on its own thread: XLA:CPU spreads a decode step's small products over its
    # intra-op threads poorly, so this is how the embedded engine uses every core.
    devices: int = 0

    def __post_init__(self):
        if not isinstance(self.devices, int) or isinstance(self.devices, bool) or self.devices < 0:
            raise ValueError(f"JaxEngineConfig.devices must be an int >= 0, got {self.devices!r}")
        validate.positive_ints(
            "JaxEngineConfig", self,
            "min_batch", "max_batch", "min_prompt_len", "min_new_tokens", "decode_chunk",
        )  # fmt: skip
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
