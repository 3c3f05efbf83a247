"""A run directory before training starts: its inputs exist, its checkpoints fit, or it starts over.

`loop.train.run` calls these before it builds anything, so a bad config or workdir is an error
that leaves nothing behind and never erases a previous run:
- `check_inputs`: the files the config names exist (data files, the initial HF checkpoint).
- `check_resumable`: the workdir's newest readable checkpoint was saved with a config this one
  can continue; `restore_latest` applies the same rule (`check_fits`) to each step it considers.
- `move_previous_run` (launch.py --start_over): the previous run's outputs move into
  `workdir/previous-<n>/` and training starts from step 0. Nothing is ever deleted.
- `lock_workdir`: one run per workdir (below).

One run per workdir. Two runs writing one workdir would each take the other's fresh checkpoints
for damage and move them aside. `prepare` therefore takes an advisory lock, `fcntl.flock` on
`workdir/run.lock`, before it looks at the checkpoints, and the run holds it until it ends. A
second run on a locked workdir is refused (exit 2) with one line naming the holder's pid, host
and start time (written into the lock file by the holder). The kernel drops a flock when the
last descriptor of the open file is closed, i.e. when the holder exits however it exits
(kill -9 included), so a stale lock never blocks a rerun: the file stays, its lock does not.
In a multi-process run only process 0 takes the lock (its holder line names process 0's host);
every process learns the outcome through an all-gather and refuses together. On a shared
filesystem this relies on the filesystem carrying flock between hosts: Linux NFS clients
(2.6.12 on) emulate flock with NFS byte-range locks, which NFSv4 servers honour across
clients (NFSv3 needs lockd running); Lustre does only with the `flock` mount option
(`localflock` locks per client), and some FUSE filesystems not at all. Where it does not, two
launches on different hosts are not kept apart: use one scheduler job per workdir.

The resume rule. A checkpoint stores its run's resolved config. A difference in a field that
changes what the saved state means blocks the resume (`BLOCKING`, minus `ALLOWED`):
- `model.*`: the parameters' shapes and layout, and what they compute; only `model.dtype` (the
  compute dtype) and `model.remat_policy` (what the backward recomputes) may change;
- `data.*`: the saved data-iterator position and the per-prompt allocation history index the
  dataset's rows in its order (files, format, filters, ids, seed, synthetic task); only
  `data.eval_paths` and `data.system_prompt` may change;
- `train.prompts_per_step`: the iterator counts batches of this size;
- `allocation.policy`, `temperature.mode`: the saved history and scheduler state belong to one
  allocator and one scheduler.
A differently shaped optimizer state (e.g. `optim.max_grad_norm` switching clipping on or off) is
caught when the step is restored, by comparing the saved items' layout with this run's.
Every other difference is reported and the run continues with the new value: `train.steps`
raised to train further, learning rate, loss, batch split, evaluation, logging, checkpointing,
mesh (the state is restored onto the new layout), engine and reward settings, `train.seed` (the
random streams of the remaining steps change). A field the saved config lacks (added to the
code since) counts as its default; a field saved under its old name (config.RENAMED) counts as
the field it was renamed to; a derived field (config.DERIVED) is not compared, its source is.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np

from dynamo_jax.checkpoint import Checkpointer, DamagedStepError, LayoutError, Restored
from dynamo_jax.config import DERIVED, RENAMED, RunConfig, section_fields, to_json_dict
from dynamo_jax.data.hub import is_hub_spec
from dynamo_jax.errors import CheckpointError, ConfigError, WorkdirInUseError
from dynamo_jax.sharding import multihost

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
# library detail kept off the console (reporting/runlog.py), e.g. orbax's tracebacks
LOG = "run.log"
LOCK = "run.lock"  # one run per workdir (the module docstring); never moved or deleted
# What a run writes into its workdir (moved, never deleted, by `move_previous_run`).
RUN_OUTPUTS = ("checkpoints", "metrics.jsonl", "tb", "plots", "config.json")

BLOCKING = ("model.*", "data.*", "train.prompts_per_step", "allocation.policy", "temperature.mode")
ALLOWED = ("model.dtype", "model.remat_policy", "data.eval_paths", "data.system_prompt")

_ABSENT = object()


def check_inputs(cfg: RunConfig) -> None:
    """The files and directories the config names exist (cheap; before anything is built)."""
    for field in ("paths", "eval_paths"):
        for i, path in enumerate(getattr(cfg.data, field)):
            if is_hub_spec(path):
                continue  # a Hub dataset: the reader loads it (or says in one line why not)
            if not Path(path).is_file():
                raise ConfigError(f"config.data.{field}[{i}]: no such file: {path}")
    if cfg.init.checkpoint:
        path = Path(cfg.init.checkpoint)
        if not path.is_dir():
            raise ConfigError(f"config.init.checkpoint: no such directory: {path}")
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"config.init.checkpoint: {path} has no config.json "
                "(a Hugging Face model directory is expected)"
            )


def _flat(config: dict, prefix: str = "") -> dict[str, Any]:
    """{"model": {"num_layers": 2}} → {"model.num_layers": 2} (lists stay whole values)."""
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def _default(name: str) -> Any:
    """The dataclass default of `section.field` (what code without the field behaved like)."""
    section, _, field = name.partition(".")
    try:
        default, _ = section_fields(section).get(field, (dataclasses.MISSING, None))
    except KeyError:
        return _ABSENT
    if default is dataclasses.MISSING:
        return _ABSENT
    return json.loads(json.dumps(default))


def _blocks(name: str) -> bool:
    if name in ALLOWED:
        return False
    return any(
        name == rule or (rule.endswith(".*") and name.startswith(rule[:-1])) for rule in BLOCKING
    )


def config_differences(saved: dict, current: dict) -> tuple[list[str], list[str]]:
    """('field old → new' that block a resume, those that do not), each sorted by field."""
    # A checkpoint of an older run names renamed fields by their old keys: compare them as new.
    old = {RENAMED.get(name, name): value for name, value in _flat(saved).items()}
    new = _flat(json.loads(json.dumps(current)))
    blocking, other = [], []
    # A derived field follows its source (config.DERIVED), whose change is the one reported.
    for name in sorted((set(old) | set(new)) - set(DERIVED)):
        before = old.get(name, _default(name))
        after = new.get(name, _ABSENT)
        if before == after:
            continue
        show = lambda v: "(absent)" if v is _ABSENT else json.dumps(v)
        (blocking if _blocks(name) else other).append(f"{name} {show(before)} → {show(after)}")
    return blocking, other


def _shown(changes: list[str], limit: int = 4) -> str:
    more = f" (+{len(changes) - limit} more)" if len(changes) > limit else ""
    return ", ".join(changes[:limit]) + more


def _way_out(workdir: Path) -> str:
    return (
        f"Rerun with the config in {workdir}/config.json, use another --workdir, or pass "
        f"--start_over to move the previous run into {workdir}/previous-N and start at step 0."
    )


def check_fits(workdir: Path, cfg: RunConfig, step: int, meta: dict) -> None:
    """Raise `CheckpointError` if step `step` (its `meta`) was saved by a run `cfg` cannot continue."""
    saved = meta.get("config")
    if not isinstance(saved, dict):
        raise CheckpointError(f"{workdir}/{CHECKPOINTS}/{step}: no saved config to compare with")
    blocking, _ = config_differences(saved, to_json_dict(cfg))
    if blocking:
        raise CheckpointError(
            f"{workdir}: its checkpoint (step {step}) was saved with a config this run cannot "
            f"continue: {_shown(blocking)}\n{_way_out(workdir)}"
        )


def report_changes(workdir: Path, cfg: RunConfig, step: int, meta: dict) -> list[str]:
    """Log (and return) the config differences a resume from `step` continues with."""
    _, other = config_differences(meta.get("config") or {}, to_json_dict(cfg))
    if other:
        log.warning(
            "resuming %s from step %d with config changes: %s", workdir, step, "; ".join(other)
        )
    return other


def restore_latest(
    ckpt: Checkpointer, abstract: dict, workdir: Path, cfg: RunConfig
) -> Restored | None:
    """`ckpt.restore_latest` for a training run: damaged steps moved aside, each candidate's
    saved config checked (`check_fits`), items of another structure explained by the config
    changes since (e.g. `optim.max_grad_norm` switching clipping off), the changes a resume
    continues with logged."""
    metas: dict[int, dict] = {}

    def check(step: int, meta: dict) -> None:
        metas[step] = meta
        check_fits(workdir, cfg, step, meta)

    try:
        restored = ckpt.restore_latest(abstract, check_meta=check, move_damaged=True)
    except LayoutError as err:
        _, changes = config_differences(metas[err.step].get("config") or {}, to_json_dict(cfg))
        since = _shown(changes) if changes else "none (the code changed since)"
        raise CheckpointError(
            f"{err}\nConfig changes since that checkpoint: {since}. {_way_out(workdir)}"
        ) from err
    if restored is not None:
        report_changes(workdir, cfg, restored.step, restored.meta)
    return restored


def check_resumable(workdir: Path, cfg: RunConfig) -> None:
    """`check_fits` on the newest checkpoint step whose meta reads (before anything is built)."""
    directory = Path(workdir) / CHECKPOINTS
    if not directory.is_dir():
        return
    ckpt = Checkpointer(directory, cfg.checkpoint, read_only=True, log_file=Path(workdir) / LOG)
    try:
        for step in reversed(ckpt.all_steps()):
            try:
                meta = ckpt.read_meta(step)
            except DamagedStepError:
                continue  # the restore reports it and moves it aside
            check_fits(Path(workdir), cfg, step, meta)
            return
    finally:
        ckpt.close()


def prepare(workdir: Path, cfg: RunConfig, *, start_over: bool) -> WorkdirLock:
    """Everything `loop.train.run` checks before it builds anything: `check_inputs`, the workdir
    lock (`lock_workdir`), then `move_previous_run` if asked to start over (and says where it
    went), else `check_resumable`. Returns the lock: the caller releases it when the run ends."""
    check_inputs(cfg)
    if Path(workdir).exists() and not Path(workdir).is_dir():
        raise ConfigError(f"--workdir {workdir}: exists and is not a directory")
    make_workdir(Path(workdir))
    lock = lock_workdir(Path(workdir))
    try:
        if not start_over:
            check_resumable(workdir, cfg)
            return lock
        moved = move_previous_run(workdir)
        if moved and multihost.is_primary():
            print(f"moved the previous run in {workdir} to {moved}", flush=True)
        return lock
    except BaseException:
        lock.release()
        raise


@dataclasses.dataclass(frozen=True)
class LockHolder:
    """Who holds a workdir's lock, as its holder wrote it into the lock file."""

    pid: int
    host: str
    started: str  # UTC, ISO 8601 to the second

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, started {self.started}"


class WorkdirLock:
    """The held lock of a workdir (`lock_workdir`); `release` is idempotent. `fd` is None on
    the processes other than 0 of a multi-process run, which hold nothing."""

    def __init__(self, path: Path, fd: int | None):
        self.path, self.fd = path, fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor drops the flock
            self.fd = None


def _read_holder(path: Path) -> LockHolder | None:
    """The holder line of lock file `path`; None if it cannot be read or is not yet written
    (the holder writes it just after it takes the lock)."""
    for _ in range(20):
        try:
            fields = json.loads(path.read_text())
            return LockHolder(int(fields["pid"]), str(fields["host"]), str(fields["started"]))
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.05)
    return None


def _try_lock(path: Path) -> int | None:
    """The descriptor of `path` with an exclusive flock taken, or None if another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": started}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    return fd


def lock_workdir(workdir: Path) -> WorkdirLock:
    """Take `workdir`'s lock for this run (process 0 only; every process calls this), or raise
    `WorkdirInUseError` naming the holder. A filesystem that refuses locks is a `ConfigError`."""
    path = Path(workdir) / LOCK
    fd, failure = None, ""
    if multihost.is_primary():
        try:
            fd = _try_lock(path)
        except OSError as err:  # e.g. a filesystem without lock support (ENOLCK)
            failure = f"--workdir {workdir}: cannot lock {path} ({err.strerror or err})"
    refused = np.asarray([fd is None and multihost.is_primary(), bool(failure)])
    refused = multihost.allgather_host(refused).any(axis=0)  # what process 0 found
    if refused[1]:
        raise ConfigError(failure or f"--workdir {workdir}: process 0 could not lock {path}")
    if refused[0]:
        holder = _read_holder(path)
        who = holder.describe() if holder else "a process that has not said who it is"
        raise WorkdirInUseError(
            f"--workdir {workdir} is in use by another run: {who} (lock {path}). Wait for it to "
            "end or stop it, or use another --workdir."
        )
    return WorkdirLock(path, fd)


def identity(workdir: Path) -> tuple[int, int] | None:
    """(device, inode) of `workdir`, None if it is not there: the directory the run started in."""
    try:
        st = os.stat(workdir)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_still_there(workdir: Path, started_in: tuple[int, int] | None) -> str | None:
    """None while `workdir` is the directory the run started in (one stat); else why not. A
    workdir deleted, unmounted or replaced mid-run would otherwise go unnoticed until the next
    checkpoint (open files keep writing into the deleted directory)."""
    now = identity(workdir)
    if now == started_in:
        return None
    what = "disappeared" if now is None else "was replaced by another directory"
    return (
        f"--workdir {workdir} {what} while the run was using it: nothing more can be saved "
        "there. Restore it (its checkpoints) and rerun the same command to resume."
    )


def make_workdir(workdir: Path) -> None:
    """Create `workdir` (and its parents) and check that a file can be written in it; a
    `ConfigError` naming it otherwise (e.g. a path under /proc, a read-only filesystem)."""
    probe = workdir / f".write-test-{os.getpid()}"
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(
            f"--workdir {workdir}: not a usable directory ({err.strerror or err})"
        ) from err


def move_previous_run(workdir: Path) -> Path | None:
    """Move the previous run's outputs into `workdir/previous-<n>/` (call on every process);
    returns that directory, or None if there was nothing to move."""
    workdir = Path(workdir)
    multihost.sync_hosts("start_over_look")  # every process looks before any moves
    present = [workdir / name for name in RUN_OUTPUTS if (workdir / name).exists()]
    if not present:
        return None
    n = 1
    while (workdir / f"previous-{n}").exists():
        n += 1
    target = workdir / f"previous-{n}"
    if multihost.is_primary():
        target.mkdir()
        for path in present:
            path.rename(target / path.name)
    multihost.sync_hosts(f"start_over_{n}")
    return target
