"""The run: `run` trains a config in a workdir, one `rl_step` (rl_step.py) after another.

`run` wraps steps with checkpointing (every M steps, at the end, on SIGTERM/Ctrl-C), evaluation
every K steps, metrics, and the failure policy (a non-finite update is skipped by the step; the run stops
at exactly `max_consecutive_nonfinite` in a row; a checkpoint is never written from such a state).
Exit statuses: dynamo_jax/errors.py `ExitCode` (docs/exit_codes.md).

Multi-process runs (`jax.distributed`, one process per host; launch.py joins the job from
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID): every process runs this same
host-side loop — same data order, allocation, seeds and scheduler — so every process holds the
whole rollout batch. The rules that keep the processes in lock step:
- generation: the JAX engine runs collectively on the global mesh and returns the same
  completions on every process (rollout/jax_engine.py); with vLLM each process's sidecars (one per
  device group) sample their slices of the requests and the completions are all-gathered
  (rollout/process_split.py); the weights are exported once per host and every sidecar verifies
  it serves them;
- scoring: each process scores its contiguous slice of the completions and the rewards are
  all-gathered, so every process holds identical rewards even if a verdict would differ between
  hosts (math-verify runs under CPU/wall limits) and scoring work is split, not repeated;
- old log-probs: the global batch is fed by rows (each process its own rows, cut from its whole
  copy; packing is deterministic, so every process builds the same packed rows), the outputs
  all-gathered back to every process;
- update: each mini-batch likewise (`multihost.global_batch_from_host`); the step's metrics are
  replicated scalars, read on every process;
- checkpoints: orbax saves and restores collectively (all processes call them; arrays are
  written shard by shard, host NumPy trees and JSON by process 0 only);
- metrics JSONL/TensorBoard/progress bar, config.json, plots and messages: process 0 only;
- SIGTERM/Ctrl-C on any process stops every process after the same step (the flag is
  all-gathered).

Exact resume: every random stream is a function of (train.seed, step): the rollout seed, the
mini-batch permutation, the data order (the iterator's own state is checkpointed), and the
batches requested ahead (k ≥ 1) are checkpointed with their completions. A run killed at any
point and restarted from its last checkpoint therefore replays the same steps bit for bit.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np

from dynamo_jax import evaluate
from dynamo_jax import workdir as run_dir
from dynamo_jax.checkpoint import Checkpointer, NonFiniteStateError, abstract_like
from dynamo_jax.config import RunConfig, to_json_dict
from dynamo_jax.errors import ConfigError, DiskFullError, RunFailedError, UserError
from dynamo_jax.evaluate import OVERALL
from dynamo_jax.loop.assemble import step_layouts
from dynamo_jax.loop.build import Trainer, build_trainer
from dynamo_jax.loop.rl_step import rl_step
from dynamo_jax.loop.timings import Stopwatch
from dynamo_jax.reporting.disk_space import free_bytes, is_out_of_space, megabytes
from dynamo_jax.reporting.metrics import MetricsWriter, NullWriter, read_metrics, truncate_metrics
from dynamo_jax.reporting.summary import RunSummary, Status, format_summary, summary_values
from dynamo_jax.sharding import multihost
from dynamo_jax.sharding.rules import replicated, row_shards
from dynamo_jax.step.optimizer import make_optimizer
from dynamo_jax.stop import StopRequest


def _base_key(tr: Trainer) -> jax.Array:
    """The run's base RNG key as checkpointed: on a multi-process mesh a replicated global array
    (orbax saves global arrays collectively; a process-local one would be written per process)."""
    key = jax.random.key(tr.cfg.train.seed)
    if multihost.is_multiprocess(tr.mesh):
        return multihost.global_from_host(key, replicated(tr.mesh))
    return key


def _checkpoint_items(tr: Trainer) -> dict[str, Any]:
    """The device items of a checkpoint: one orbax item each, so parameters restore alone."""
    progress = {"step": tr.state.step, "rng": _base_key(tr)}
    return {"params": tr.state.params, "opt_state": tr.state.opt_state, "progress": progress}


def _checkpoint(tr: Trainer, ckpt: Checkpointer, step: int, writer: Any) -> bool:
    try:
        ckpt.save(
            step,
            device=_checkpoint_items(tr),
            host=tr.host_state(),
            meta={"step": step, "config": to_json_dict(tr.cfg)},
        )
        return True
    except NonFiniteStateError as err:
        writer.message(f"step {step}: NOT checkpointed: {err}")
        return False


def _restore(tr: Trainer, ckpt: Checkpointer, workdir: Path) -> int:
    """Resume from the newest intact checkpoint; returns its step (0 for a fresh run).

    Damaged steps are moved aside; a checkpoint this config cannot continue is an error
    (workdir.py); a disk without room for the next checkpoint is a `DiskFullError` before
    anything is written. metrics.jsonl is cut back to the step, 0 included."""
    restored = run_dir.restore_latest(ckpt, abstract_like(_checkpoint_items(tr)), workdir, tr.cfg)
    # A run killed between a save and orbax's pruning left a step too many; with nothing left
    # to save (the run had finished) no later save would delete it.
    ckpt.prune()
    step = 0
    if restored is not None:
        step = restored.step
        items = restored.device
        tr.state = tr.state.replace(
            params=items["params"], opt_state=items["opt_state"], step=items["progress"]["step"]
        )
        tr.load_host_state(restored.host)
        tr.engine.update_weights(tr.state.params, step)
    cfg = tr.cfg
    if step < cfg.train.steps:  # a disk too full for one checkpoint: stop now, before a write
        every = cfg.checkpoint.every_steps
        next_save = min((step // every + 1) * every, cfg.train.steps)
        # (host trees are small, and host_state() may wait for batches in flight: left out)
        ckpt.check_space(next_save, _checkpoint_items(tr), {})
    if multihost.is_primary():
        truncate_metrics(workdir, step)
        if step:
            print(f"resumed {workdir} from step {step}", flush=True)
    return step


def _any_process(flag: bool) -> bool:
    """True if `flag` is set on any process (every process must call this at the same point)."""
    return bool(multihost.allgather_host(np.asarray(flag)).any())


def run(cfg: RunConfig, workdir: str | Path, *, start_over: bool = False) -> RunSummary:
    """Train (resuming from `workdir`'s latest checkpoint if any); prints and returns a summary.

    Before anything is built, the config's input files, its mesh and the workdir are checked: a
    checkpoint this config cannot continue is a `CheckpointError`, unless `start_over` moves the
    previous run aside (workdir.py). SIGTERM or Ctrl-C finishes the step in flight, checkpoints
    and returns INTERRUPTED; a second one raises KeyboardInterrupt. A `UserError` raised once
    training has started is re-raised as `RunFailedError` (exit status FAILED, not REFUSED). The
    summary's `exit_code` is launch.py's exit status (errors.py `ExitCode`)."""
    stop = StopRequest()
    previous = stop.install()  # before the build, so a SIGTERM while compiling is handled too
    try:
        return _run(cfg, Path(workdir), start_over, stop)
    finally:
        stop.restore(previous)


def check_mesh(cfg: RunConfig) -> None:
    """The configured mesh fits the devices there are and splits every batch into whole rows per
    device (ConfigError naming config.mesh.shape): a run, or a resume on another mesh, that
    cannot is refused before anything is built, not by a traceback from the build."""
    used = len(jax.devices())
    shape = cfg.mesh.shape
    if -1 not in shape and 0 < int(np.prod(shape)) < used and jax.process_count() == 1:
        used = int(np.prod(shape))  # a smaller fixed mesh uses the first devices (build.py)
    try:
        step_layouts(cfg, row_shards(cfg.mesh.axis_sizes(used), cfg.mesh.rules))
    except ValueError as err:
        raise ConfigError(f"config.mesh.shape: {err}") from err


def _run(cfg: RunConfig, workdir: Path, start_over: bool, stop: StopRequest) -> RunSummary:
    check_mesh(cfg)
    lock = run_dir.prepare(workdir, cfg, start_over=start_over)  # one run per workdir
    try:
        return _train(cfg, workdir, stop)
    finally:
        lock.release()


def _train(cfg: RunConfig, workdir: Path, stop: StopRequest) -> RunSummary:
    primary = multihost.is_primary()  # metrics, config.json, plots and the summary: once
    tr = build_trainer(cfg, workdir)
    ckpt = Checkpointer(
        workdir / run_dir.CHECKPOINTS, cfg.checkpoint, log_file=workdir / run_dir.LOG
    )
    writer: Any = NullWriter()
    start = done = -1  # -1 until the restore: no summary for a run that never started
    status, reason = Status.FINISHED, ""
    started_in = run_dir.identity(workdir)  # checked each step: a workdir deleted mid-run
    try:
        start = done = _restore(tr, ckpt, workdir)
        if primary:
            (workdir / "config.json").write_text(json.dumps(to_json_dict(cfg), indent=1))
            writer = MetricsWriter(
                workdir,
                cfg.logging,
                total_steps=cfg.train.steps,
                start_step=start,
                run_name=cfg.name,
                run_config=to_json_dict(cfg),
            )
        if start < cfg.train.steps and _any_process(stop.requested):
            status, reason = Status.INTERRUPTED, f"{stop.signal_name} before the first step"
        elif start == 0 and cfg.eval.at_start and tr.task.eval_rows:
            # The base model's numbers, the "before" of the summary's before → after.
            with Stopwatch() as clock:
                before = evaluate.evaluate_in_loop(tr.engine, tr.task, tr.cfg, 0)
            writer.write(0, {**before, "time/eval": clock.seconds}, advance=False)
        for step in range(start + 1, cfg.train.steps + 1):
            if status is not Status.FINISHED:
                break
            gone = run_dir.check_still_there(workdir, started_in)
            if _any_process(gone is not None):
                raise RunFailedError(gone or "--workdir disappeared on another process")
            outcome = rl_step(tr, step)
            tr.advance(outcome.state, outcome.consecutive_nonfinite, outcome.skipped_updates)
            metrics = dict(outcome.metrics)
            if cfg.eval.every_steps and step % cfg.eval.every_steps == 0:
                with Stopwatch() as clock:
                    metrics.update(evaluate.evaluate_in_loop(tr.engine, tr.task, tr.cfg, step))
                metrics["time/eval"] = clock.seconds
            writer.write(step, metrics)
            done = step
            limit = cfg.train.max_consecutive_nonfinite
            if tr.consecutive_nonfinite >= limit:
                status = Status.NONFINITE
                reason = (
                    f"{tr.consecutive_nonfinite} non-finite updates in a row (limit "
                    f"train.max_consecutive_nonfinite = {limit}); this step was not checkpointed"
                )
                writer.message(f"step {step}: {reason}; stopping")
                break
            stop.raise_if_aborted()  # before the checkpoint: a second signal writes none
            stopping = _any_process(stop.requested)  # every process stops after the same step
            last = step == cfg.train.steps or stopping
            if step % cfg.checkpoint.every_steps == 0 or last:
                _checkpoint(tr, ckpt, step, writer)
            if stopping:
                status, reason = Status.INTERRUPTED, stop.signal_name or "interrupted"
                break
    except KeyboardInterrupt:  # the second signal; reported in the summary, then raised
        status, reason = Status.ABORTED, "stopped mid-step by a second signal, not checkpointed"
        raise
    except DiskFullError as err:  # a checkpoint, metrics or TensorBoard write: one line, 6
        status, reason = Status.FAILED, str(err)
        raise DiskFullError(f"{err}; {ckpt.intact_note()}") from err
    except UserError as err:  # a known failure, but training had started: FAILED, one line
        status, reason = Status.FAILED, f"{type(err).__name__}: {err}".splitlines()[0]
        if start < 0:
            raise
        raise RunFailedError(f"step {done + 1}: {err}") from err
    except Exception as err:  # reported in the summary, then raised as it was
        status, reason = Status.FAILED, f"{type(err).__name__}: {err}".splitlines()[0]
        gone = run_dir.check_still_there(workdir, started_in)
        if gone is not None:  # deleted while a write (a checkpoint) was in flight: one line
            raise RunFailedError(f"step {done + 1}: {gone}") from err
        if is_out_of_space(err):  # a write of the loop's own (config.json): one line too
            what = getattr(err, "filename", None) or f"a file in {workdir}"
            free = megabytes(free_bytes(workdir))
            raise DiskFullError(
                f"{what} not written: no space left on device, {free} free; {ckpt.intact_note()}"
            ) from err
        raise
    finally:
        ckpt.wait()
        saved = ckpt.latest_step()
        ckpt.close()
        writer.close()
        tr.engine.close()
        tr.task.close()
        plots = cfg.logging.plots_at_end and primary and start >= 0 and status is not Status.FAILED
        if plots:
            from dynamo_jax.reporting.plots import write_plots

            write_plots(workdir)
        summary = RunSummary(
            name=cfg.name, workdir=workdir, status=status, reason=reason,
            start_step=max(start, 0), last_step=max(done, 0), total_steps=cfg.train.steps,
            checkpoint_step=saved, skipped_updates=tr.skipped_updates,
            tensorboard=cfg.logging.tensorboard, plots=plots,
        )  # fmt: skip
        if primary and start >= 0:
            records = read_metrics(workdir)
            print(format_summary(summary, records, OVERALL), flush=True)
            writer.end(summary_values(summary, records, OVERALL), summary.exit_code)
    return summary


def dry_run(cfg: RunConfig) -> dict:
    """The sharding planner on abstract shapes for this config's model, loss, mesh and batch."""
    from dynamo_jax.step.planner import format_report, row_batch_shape, run_dry_run

    axis_sizes = cfg.mesh.axis_sizes(cfg.dry_run.num_devices)
    layout = step_layouts(cfg, row_shards(axis_sizes, cfg.mesh.rules)).update
    report = run_dry_run(
        cfg.model,
        cfg.loss,
        cfg.mesh,
        num_devices=cfg.dry_run.num_devices,
        **row_batch_shape(layout),
        device_memory_gb=cfg.dry_run.device_memory_gb,
        optimizer_factory=functools.partial(make_optimizer, cfg.optim, cfg.total_updates),
    )
    print(format_report(report))
    return report
