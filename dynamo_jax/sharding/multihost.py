"""Multi-host setup: `jax.distributed` initialisation and per-process batch feeding.

Where host-side work runs (each function below says which processes call it):
- `initialize_distributed`: EVERY process, before any other JAX call.
- `make_global_batch` / `local_batch_rows`: EVERY process, each with only its own rows; the
  global batch is never materialised on one host.
- `is_primary`: guards work done ONCE per job: logging/TensorBoard, printing, the rollout
  sidecar, checkpoint metadata written outside orbax. Orbax checkpoint saves and restores are
  collective: every process calls them (each writes its own shards).
- `sync_hosts`: EVERY process (a barrier; a process that skips it hangs the others).
- `global_from_host` / `global_batch_from_host` / `host_copy`: EVERY process, each holding (or
  receiving) the same full host value. The training loop runs the same host-side work on every
  process, so every process already holds the whole rollout batch; these cut it into the rows
  each process owns, and bring sharded outputs back whole to every process.
- `allgather_host`: EVERY process, each with its own host array of the same shape.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding

# The usual launcher-independent variables (also read by many cluster wrappers).
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """How to join a multi-process job; all None means: from the environment, else single process.

    Attributes:
      coordinator_address: "host:port" of process 0's coordinator service.
      num_processes: total number of processes in the job.
      process_id: this process's index in [0, num_processes).
      initialization_timeout_s: how long to wait for all processes to join.
    """

    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    initialization_timeout_s: int = 300

    def __post_init__(self):
        if self.coordinator_address is not None and ":" not in self.coordinator_address:
            raise ValueError(
                "DistributedConfig.coordinator_address must be 'host:port', got "
                f"{self.coordinator_address!r}"
            )
        if self.num_processes is not None and self.num_processes < 1:
            raise ValueError(
                f"DistributedConfig.num_processes must be >= 1, got {self.num_processes}"
            )
        if self.process_id is not None:
            if self.process_id < 0:
                raise ValueError(
                    f"DistributedConfig.process_id must be >= 0, got {self.process_id}"
                )
            if self.num_processes is not None and self.process_id >= self.num_processes:
                raise ValueError(
                    f"DistributedConfig.process_id {self.process_id} must be < num_processes "
                    f"{self.num_processes}"
                )
        if self.initialization_timeout_s < 1:
            raise ValueError(
                "DistributedConfig.initialization_timeout_s must be >= 1, got "
                f"{self.initialization_timeout_s}"
            )


def resolve_distributed_config(
    cfg: DistributedConfig, environ: Mapping[str, str] | None = None
) -> DistributedConfig:
    """Fill unset fields from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID."""
    env = os.environ if environ is None else environ

    def _int(name: str) -> int | None:
        raw = env.get(name)
        if raw in (None, ""):
            return None
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None

    return DistributedConfig(
        coordinator_address=cfg.coordinator_address or env.get(ENV_COORDINATOR) or None,
        num_processes=cfg.num_processes
        if cfg.num_processes is not None
        else _int(ENV_NUM_PROCESSES),
        process_id=cfg.process_id if cfg.process_id is not None else _int(ENV_PROCESS_ID),
        initialization_timeout_s=cfg.initialization_timeout_s,
    )


def initialize_distributed(
    cfg: DistributedConfig, environ: Mapping[str, str] | None = None
) -> bool:
    """Join the multi-process job if one is configured. Call on EVERY process, before JAX use.

    Returns True if `jax.distributed` was initialised (or already was), False for a
    single-process run (nothing configured, or num_processes == 1).
    """
    cfg = resolve_distributed_config(cfg, environ)
    fields = (cfg.coordinator_address, cfg.num_processes, cfg.process_id)
    if all(f is None for f in fields) or cfg.num_processes == 1:
        return False
    if any(f is None for f in fields):
        raise ValueError(
            "multi-process run needs coordinator_address, num_processes and process_id (from "
            f"DistributedConfig or {ENV_COORDINATOR}/{ENV_NUM_PROCESSES}/{ENV_PROCESS_ID}); got "
            f"{cfg}"
        )
    if jax.distributed.is_initialized():
        return True
    jax.distributed.initialize(
        coordinator_address=cfg.coordinator_address,
        num_processes=cfg.num_processes,
        process_id=cfg.process_id,
        initialization_timeout=cfg.initialization_timeout_s,
    )
    return True


def is_primary() -> bool:
    """True on process 0: the one process that logs, prints and writes metrics and plots."""
    return jax.process_index() == 0


def sync_hosts(name: str) -> None:
    """Barrier across processes (no-op with one process). Call on EVERY process."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def local_batch_rows(sharding: NamedSharding, global_batch_size: int) -> slice:
    """The contiguous rows of the global batch this process must feed for `sharding`.

    Devices are ordered process-major in the mesh, so a process's shards of the batch dimension
    form one contiguous block; this is checked rather than assumed.
    """
    index_map = sharding.addressable_devices_indices_map((global_batch_size,))
    rows = sorted({idx[0].indices(global_batch_size)[:2] for idx in index_map.values()})
    start, stop = rows[0][0], rows[0][1]
    for lo, hi in rows[1:]:
        if lo != stop:
            raise ValueError(
                f"process {jax.process_index()} owns non-contiguous batch rows {rows}; the mesh "
                "must place each process's devices together along the batch axes"
            )
        stop = hi
    return slice(start, stop)


def make_global_batch(
    local_batch: Mapping[str, np.ndarray],
    shardings: Mapping[str, NamedSharding],
    global_batch_size: int,
) -> dict[str, jax.Array]:
    """Global jax.Arrays from this process's rows. Call on EVERY process with its own rows.

    Arrays whose sharding is replicated (e.g. the scalar temperature) must be identical on every
    process and are passed whole. Others are this process's `local_batch_rows` of the batch.
    A value that is already a global jax.Array with the target sharding (e.g. old log-probs
    straight from `make_logprob_fn`) passes through untouched.
    """
    missing = set(shardings) - set(local_batch)
    if missing:
        raise KeyError(f"local batch is missing fields {sorted(missing)}")
    out = {}
    for key, sharding in shardings.items():
        value = local_batch[key]
        if isinstance(value, jax.Array) and value.sharding == sharding:
            out[key] = value
            continue
        local = np.asarray(value)
        if sharding.is_fully_replicated:
            out[key] = jax.make_array_from_process_local_data(sharding, local, local.shape)
            continue
        rows = local_batch_rows(sharding, global_batch_size)
        if local.shape[0] != rows.stop - rows.start:
            raise ValueError(
                f"batch field {key!r}: process {jax.process_index()} must feed rows "
                f"[{rows.start}, {rows.stop}) = {rows.stop - rows.start} rows, got {local.shape[0]}"
            )
        global_shape = (global_batch_size, *local.shape[1:])
        out[key] = jax.make_array_from_process_local_data(sharding, local, global_shape)
    return out


def is_multiprocess(mesh_or_sharding) -> bool:
    """True if a mesh (or sharding) holds devices of other processes, i.e. host values must be
    turned into global arrays explicitly and outputs gathered before they can be read."""
    devices = getattr(mesh_or_sharding, "devices", None)
    if devices is not None and not callable(devices):  # a Mesh: ndarray of devices
        flat = devices.flat
    else:
        flat = mesh_or_sharding.device_set
    return any(d.process_index != jax.process_index() for d in flat)


def global_from_host(x, sharding: NamedSharding) -> jax.Array:
    """A global array with `sharding` from a host value EVERY process holds in full.

    Each process fills only its addressable shards (no communication). PRNG key arrays are
    carried as their raw key data and re-wrapped, since keys cannot be sliced on the host.
    """
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(x)
        data = np.asarray(jax.random.key_data(x))
        data_sharding = NamedSharding(sharding.mesh, sharding.spec)  # trailing dims replicated
        return jax.random.wrap_key_data(global_from_host(data, data_sharding), impl=impl)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def global_batch_from_host(
    batch: Mapping[str, np.ndarray],
    shardings: Mapping[str, NamedSharding],
    global_batch_size: int,
) -> dict[str, jax.Array]:
    """`make_global_batch` for a batch EVERY process holds whole: each feeds only its own rows
    (`local_batch_rows`), the replicated fields (the temperature) whole."""
    local = {}
    for key, sharding in shardings.items():
        value = batch[key]
        if sharding.is_fully_replicated or isinstance(value, jax.Array):
            local[key] = value
        else:
            local[key] = np.asarray(value)[local_batch_rows(sharding, global_batch_size)]
    return make_global_batch(local, shardings, global_batch_size)


def host_copy(x: jax.Array) -> np.ndarray:
    """The whole value of `x` as NumPy on EVERY process: a plain copy when this process can see
    all of it (one process, or replicated), an all-gather across processes otherwise."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def allgather_host(x: np.ndarray) -> np.ndarray:
    """[num_processes, *x.shape]: every process's `x` stacked in process order (x as [1, ...]
    with one process). Call on EVERY process with arrays of equal shape and dtype."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x[None]
    return np.asarray(multihost_utils.process_allgather(x, tiled=False))
