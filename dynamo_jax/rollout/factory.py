"""The configured rollout engine: the embedded JAX sampler or the vLLM sidecar(s).

`build_engine(cfg, params, ...)` returns a `RolloutEngine` holding `params` as weight version 0;
the training loop, the in-loop evaluation and `python -m dynamo_jax.evaluate` all get their
engine here, so the choice between engines is made in this one place.
"""

from __future__ import annotations

from typing import Any

import jax

from dynamo_jax.config import RunConfig
from dynamo_jax.rollout.protocol import RolloutEngine


def build_engine(
    cfg: RunConfig, params: Any, mesh: Any, param_shardings: Any, workdir: Any
) -> RolloutEngine:
    """The configured `RolloutEngine`, holding `params` as weight version 0."""
    if cfg.rollout.engine == "jax":
        from dynamo_jax.rollout.jax_engine import JaxEngine

        return JaxEngine(
            cfg.model,
            params,
            cfg.jax_engine,
            mesh=mesh,
            rules=cfg.mesh.rules,
            param_shardings=param_shardings,
        )
    from dynamo_jax.rollout.process_split import ProcessSplitEngine
    from dynamo_jax.rollout.sidecar_client import SidecarConfig, VLLMSidecarEngine

    if not cfg.init.checkpoint:
        raise ValueError("rollout.engine='vllm' needs init.checkpoint (vLLM starts from HF files)")
    sidecar = SidecarConfig(
        python=cfg.rollout.sidecar_python,
        model_path=cfg.init.checkpoint,
        dtype=cfg.rollout.vllm_dtype,
        max_model_len=cfg.max_seq_len,
        seed=cfg.train.seed,
        enforce_eager=cfg.rollout.vllm_enforce_eager,
        gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
        max_num_seqs=cfg.rollout.vllm_max_num_seqs,
    )
    # Weight version 0 is init.checkpoint itself, which is what `params` were loaded from.
    if jax.process_count() == 1:
        return VLLMSidecarEngine(sidecar, cfg.model, workdir=workdir)
    # Several processes: each starts a sidecar on its own host (the checkpoint must be at
    # init.checkpoint on every host) and samples its slice of each batch; logs apart.
    log_dir = f"{workdir}/sidecar_process{jax.process_index()}"
    return ProcessSplitEngine(VLLMSidecarEngine(sidecar, cfg.model, workdir=log_dir))
