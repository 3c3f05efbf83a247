"""Everything a run builds once from its config (`build_trainer` → `Trainer`): the mesh, the
task, the model state, the jitted train step and log-prob function, the rollout engine, the
allocator and its history, the temperature scheduler and the data iterator; and the host-side
state a checkpoint keeps besides the device arrays (`Trainer.host_state`).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dynamo_jax import tasks
from dynamo_jax.allocation import make_allocator, make_history
from dynamo_jax.allocation.history import PromptHistory
from dynamo_jax.config import RunConfig
from dynamo_jax.engine_factory import build_engine
from dynamo_jax.loop.assemble import StepLayouts, step_layouts
from dynamo_jax.loop.behaviour_pass import BehaviourAhead
from dynamo_jax.rollout.background import BackgroundCapable, BackgroundEngine
from dynamo_jax.rollout.pipeline import RolloutPipeline
from dynamo_jax.rollout.protocol import RolloutEngine
from dynamo_jax.sharding.mesh import build_mesh
from dynamo_jax.sharding.rules import row_shards
from dynamo_jax.step.forward import LogprobFn, make_logprob_fn
from dynamo_jax.step.optimizer import make_optimizer
from dynamo_jax.step.state import TrainState, init_train_state, train_state_from_params
from dynamo_jax.step.train_step import TrainStep, make_train_step
from dynamo_jax.temperature import TemperatureScheduler

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Trainer:
    """Everything built once from the config, and the run's state between steps: `rl_step`
    reads it and returns a `StepOutcome`, which the run (train.py) takes in (`advance`)."""

    cfg: RunConfig
    mesh: Any
    task: tasks.Task
    engine: RolloutEngine
    allocator: Any  # allocation.Allocator
    history: PromptHistory
    scheduler: TemperatureScheduler
    data_iter: Any  # data.EpochIterator
    layouts: StepLayouts  # the update's and the log-prob pass's row layouts
    train_step: TrainStep  # built for layouts.update
    logprob: LogprobFn  # built for layouts.logprob_pass
    state: TrainState
    pipeline: RolloutPipeline  # the batches requested and not yet trained on
    ref_params: Any = None  # frozen reference policy, only when the loss has a KL term
    consecutive_nonfinite: int = 0
    skipped_updates: int = 0

    def advance(self, state: TrainState, consecutive_nonfinite: int, skipped_updates: int) -> None:
        """Take in a step's outcome (rl_step.py `StepOutcome`)."""
        self.state = state
        self.consecutive_nonfinite = consecutive_nonfinite
        self.skipped_updates = skipped_updates

    # -- checkpoint payload -------------------------------------------------------------
    def host_state(self) -> dict:
        host = {
            "data": self.data_iter.state_dict(),
            "history": self.history.state_dict(),
            "temperature": self.scheduler.state_dict(),
            "loop": {
                "consecutive_nonfinite": np.int64(self.consecutive_nonfinite),
                "skipped_updates": np.int64(self.skipped_updates),
            },
        }
        if self.cfg.train.max_staleness:
            # Waits for the batches in flight (and computes their π_old); every process calls
            # this at the same point, so the collectives inside line up.
            ahead = BehaviourAhead(self.cfg, self.task, self.logprob)
            host["pipeline"] = self.pipeline.state_dict(ahead)
        return host

    def load_host_state(self, host: dict) -> None:
        self.data_iter.load_state_dict(host["data"])
        self.history = PromptHistory.from_state_dict(
            host["history"], decay=self.cfg.allocation.decay, num_prompts=self.task.num_prompts
        )
        self.scheduler.load_state_dict(host["temperature"])
        self.consecutive_nonfinite = int(host["loop"]["consecutive_nonfinite"])
        self.skipped_updates = int(host["loop"]["skipped_updates"])
        if "pipeline" in host:  # a run with max_staleness 0 wrote none
            self.pipeline.load_state_dict(host["pipeline"])


def _mesh_devices(shape: tuple[int, ...]) -> list:
    """All devices, or the first prod(shape) of them when the shape is fixed and smaller (a
    1-device config then runs unchanged on a host with more devices, e.g. simulated ones)."""
    devices = jax.devices()
    if -1 not in shape and 0 < int(np.prod(shape)) < len(devices) and jax.process_count() == 1:
        log.warning("mesh %s uses %d of %d devices", shape, int(np.prod(shape)), len(devices))
        return devices[: int(np.prod(shape))]
    return devices


def build_trainer(cfg: RunConfig, workdir: Path) -> Trainer:
    """Mesh, task, model state, jitted functions, engine, allocator and scheduler."""
    mesh = build_mesh(cfg.mesh, _mesh_devices(cfg.mesh.shape))
    task = tasks.build_task(cfg)
    optimizer = make_optimizer(cfg.optim, cfg.total_updates)
    layouts = step_layouts(cfg, row_shards(mesh.shape, cfg.mesh.rules))
    train_step = make_train_step(
        cfg.model,
        cfg.loss,
        optimizer,
        mesh,
        cfg.mesh.rules,
        batch_size=layouts.update.max_rows,
        micro_batches=layouts.update.max_micro_batches,
        seed=cfg.train.seed,
        shared_prompts=layouts.update.shared_prompts,
        is_weights=cfg.train.rollout_correction.weights,
    )
    if cfg.init.checkpoint:
        from dynamo_jax.models.hf_io import load_hf_checkpoint

        _, params = load_hf_checkpoint(
            cfg.init.checkpoint, cfg=cfg.model, shardings=train_step.state_shardings.params
        )
        state = train_state_from_params(params, optimizer, train_step.state_shardings)
    else:
        # the seed, not a key: the key is made inside the state's one init program
        state = init_train_state(cfg.model, optimizer, mesh, cfg.mesh.rules, cfg.train.seed)
    logprob = make_logprob_fn(cfg.model, mesh, cfg.mesh.rules, layouts.logprob_pass)
    ref_params = None
    if cfg.loss.kl != "none":
        # A frozen copy: the train step donates `state`, so the reference needs its own buffers.
        ref_params = jax.tree.map(jnp.copy, state.params)
    engine = build_engine(cfg, state.params, mesh, train_step.state_shardings.params, workdir)
    if cfg.train.max_staleness and isinstance(engine, BackgroundCapable):
        engine = BackgroundEngine(engine)  # the vLLM sidecar generates while the trainer trains
    return Trainer(
        cfg=cfg,
        mesh=mesh,
        task=task,
        engine=engine,
        allocator=make_allocator(cfg.allocation),
        history=make_history(cfg.allocation, task.num_prompts),
        scheduler=TemperatureScheduler(cfg.temperature),
        data_iter=task.iterator(cfg.data.seed, cfg.train.prompts_per_step),
        layouts=layouts,
        train_step=train_step,
        logprob=logprob,
        state=state,
        pipeline=RolloutPipeline(
            engine,
            max_staleness=cfg.train.max_staleness,
            last_step=cfg.train.steps,
            source=cfg.train.old_logp_source,
        ),
        ref_params=ref_params,
    )
