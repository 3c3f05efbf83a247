"""Save and restore everything a run needs to continue exactly where it stopped.

A checkpoint is one orbax step directory with one item per part of the run's state, so a reader
restores only what it needs (export and evaluation read `params` and never build an optimizer):
- device items, each a pytree restored onto the shardings of an abstract template so a resumed
  run lands on the same mesh layout: `params`, `opt_state`, and `progress` (the applied-update
  counter and the base RNG key);
- `host`: host-side NumPy trees (data-iterator state, allocator history, temperature-scheduler
  state). They hold arrays, so they go in a `StandardSave` item (`JsonSave` cannot hold arrays);
- `meta`: JSON: the step, the resolved config (a resumed run is checked against it) and a
  checksum of every other item.

Checksums (checkpoint_checksums.py): two 32-bit sums of every device leaf's raw bits (any
flipped bit changes one), computed on device whatever the sharding; a SHA-256 of every host leaf
and of the config. `restore` recomputes them and reports a mismatch as damage: a checksum of the
values (not of the files) flags exactly the corruption that would change what the run resumes
with.

Atomicity: orbax writes each step into a temporary directory and renames it on commit, so a run
killed mid-save leaves no half-written step that `latest_step` would pick up. A step that is
damaged anyway (disk error, flipped bits, hand-edited files) fails to restore; `restore_latest`
then falls back to the previous step and says so, and a training run moves the damaged one aside
(`<step>.damaged-<n>`, kept for inspection, ignored by orbax) so it can write that step again.
A step that is intact but does not fit the template (another model shape or optimizer) is not
damage: it raises `LayoutError` and is left as it is. `save` refuses state with NaN/Inf, so
a corrupted update can never become the checkpoint a later run resumes from.

Damage that reading would hang on or that orbax would delete is found before orbax looks
(`find_unsafe`, by `lstat`/`stat` only, never opening a file): a named pipe, socket, device
file, dangling link or directory where orbax writes a regular file (a pipe blocks the first read
forever), and a step name that is not a directory (orbax ignores it and then deletes it when it
saves that step). A writable checkpointer moves such steps aside before it opens the directory;
a read-only one leaves them and skips them. The step recorded in `meta` must equal the step's
name: a whole step copied or renamed to another number is damage too. Library log records
(orbax's asynchronous tracebacks) go to the log file given (the workdir's run.log), not the
console, while steps are read or written (reporting/runlog.py).

Disk space: before each save, the step's size is estimated (the newest committed step's, or the
state's bytes before the first) and checked against the free space: a save that cannot fit
raises `DiskFullError` (exit 6) before anything is written, and one warning says when the steps
`max_to_keep` keeps (plus the one orbax writes before it deletes the oldest) will not fit. A
save that runs out of space anyway (another writer filled the disk) raises the same one-line
error: the partial `<step>.orbax-checkpoint-tmp*` is removed, earlier steps are not touched,
and orbax's tracebacks go to the log file.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from dynamo_jax.checkpoint_checksums import (
    config_checksum,
    host_checksums,
    inspect_items,
    mismatches,
)
from dynamo_jax.checkpoint_config import CheckpointConfig
from dynamo_jax.errors import CheckpointError, DiskFullError
from dynamo_jax.reporting import runlog
from dynamo_jax.reporting.disk_space import (
    free_bytes,
    intact_note,
    is_out_of_space,
    leaves_bytes,
    megabytes,
    remove_partials,
    steady_state_shortfall,
    tree_bytes,
)
from dynamo_jax.sharding import multihost

log = logging.getLogger(__name__)

DEVICE_ITEMS = ("params", "opt_state", "progress")  # pytrees restored onto device shardings
HOST, META = "host", "meta"  # host NumPy trees; JSON (step, config, checksums)
_DAMAGED = re.compile(r"^(\d+)\.damaged-(\d+)$")
_STEP = re.compile(r"^\d+$")  # orbax's step directory names
# Directories orbax writes below an item; every other entry must be a regular file.
_ITEM_DIRS = re.compile(r"^(d|array_metadatas|ocdbt\.process_\d+)$")
# A first save's estimate from the state's bytes: orbax's metadata and OCDBT's index on top.
_OVERHEAD_FACTOR, _OVERHEAD_BYTES = 1.1, 1 << 18


@dataclasses.dataclass(frozen=True)
class Restored:
    """What `Checkpointer.restore` read: only the items that were asked for."""

    step: int
    device: dict[str, Any]  # item name → device pytree (structure and shardings of the template)
    host: dict | None  # NumPy trees as saved (None when not asked for)
    meta: dict  # JSON as saved: step, config, checksums


class NonFiniteStateError(ValueError):
    """Raised instead of writing a checkpoint whose state holds NaN or Inf."""


class LayoutError(CheckpointError):
    """An intact step whose items do not fit the template (another model or optimizer)."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


class DamagedStepError(Exception):
    """One step cannot be read back as it was written (missing or corrupt files, a checksum
    mismatch). Callers fall back to an older step; it never reaches the user as such."""


# ----------------------------------------------------------------------------- helpers


def _to_numpy_tree(tree: Any) -> Any:
    """Python scalars → 0-d arrays so orbax stores (and restores) every host leaf as an array."""
    return jax.tree.map(np.asarray, tree)


def _stored_layout(leaf: Any) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) as orbax stores a leaf: a typed PRNG key as its raw uint32 key data."""
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.eval_shape(jax.random.key_data, leaf)
    return tuple(leaf.shape), str(jnp.dtype(leaf.dtype))


def _layout_differences(saved: Any, template: Any, limit: int = 3) -> list[str]:
    """'path: saved … vs expected …' for leaves whose presence, shape or dtype differ."""
    have = {k: _stored_layout(v) for k, v in ocp.tree.to_flat_dict(saved).items() if v is not None}
    want = {k: _stored_layout(v) for k, v in ocp.tree.to_flat_dict(template).items()}
    out = []
    for key in sorted(set(have) | set(want)):
        if have.get(key) != want.get(key):
            name = "/".join(key)
            fmt = lambda lay: "absent" if lay is None else f"{lay[1]}{list(lay[0])}"
            out.append(f"{name}: saved {fmt(have.get(key))}, expected {fmt(want.get(key))}")
    return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


def _short(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0][:100] if str(err) else ''}"


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def step_unsafe(path: Path) -> str | None:
    """Why the step at `path` must not be given to orbax (None if its layout is sound), found
    with stat calls only: orbax opening a pipe blocks forever, a device never ends."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        return f"it cannot be examined ({err.strerror})"
    if not stat.S_ISDIR(mode):
        return f"it is {_kind(mode)}, not a step directory"
    for root, dirs, files in os.walk(path):
        depth = len(Path(root).relative_to(path).parts)
        for name in [*dirs, *files]:
            entry = Path(root) / name
            try:
                mode = os.stat(entry).st_mode  # follows a link: its target is what is read
            except OSError as err:
                return f"{entry.relative_to(path)} cannot be examined ({err.strerror})"
            wanted_dir = (depth == 0 and name in (*DEVICE_ITEMS, HOST, META)) or (
                depth > 0 and _ITEM_DIRS.match(name) is not None
            )
            if stat.S_ISDIR(mode) and not wanted_dir:
                return f"{entry.relative_to(path)} is a directory where a file belongs"
            if not stat.S_ISDIR(mode) and not stat.S_ISREG(mode):
                return f"{entry.relative_to(path)} is {_kind(mode)}, not a regular file"
    return None


def find_unsafe(directory: Path) -> dict[str, str]:
    """Step name → why, for every entry of `directory` named like a step that `step_unsafe`
    refuses (stat calls only)."""
    if not directory.is_dir():
        return {}
    out = {}
    for entry in sorted(directory.iterdir(), key=lambda p: p.name):
        if _STEP.match(entry.name):
            why = step_unsafe(entry)
            if why is not None:
                out[entry.name] = why
    return out


# ----------------------------------------------------------------------------- the manager


class Checkpointer:
    """orbax CheckpointManager with the run's items, checksums and a damaged-step fallback.

    `read_only` opens an existing directory for reading (export, evaluation): nothing is created,
    deleted or moved. `log_file`: where library detail goes while steps are read
    (reporting/runlog.py)."""

    def __init__(
        self,
        directory: str | Path,
        config: CheckpointConfig,
        *,
        read_only: bool = False,
        log_file: str | Path | None = None,
    ):
        self.directory = Path(directory).absolute()
        self.config = config
        self.read_only = read_only
        self.log_file = Path(log_file) if log_file is not None else None
        self._space_warned = False
        self._manager_failed = False  # a save ran out of space: closing may raise its leftovers
        if read_only and not self.directory.is_dir():
            raise CheckpointError(f"{self.directory}: no checkpoint directory")
        # Steps orbax must never open (it reads every step's metadata when it opens the
        # directory): a writer moves them aside now, a reader skips them.
        self._unsafe = find_unsafe(self.directory)
        if not read_only:
            for name, why in self._unsafe.items():
                self._report(name, why, self._set_aside(name, reload=False))
            self._unsafe = {}
        # (orbax's own read_only option logs warnings on every open; a reader just never saves.)
        # A reader with unsafe steps reads no step metadata when it opens (lightweight).
        options = ocp.CheckpointManagerOptions(
            max_to_keep=config.max_to_keep,
            create=not read_only,
            enable_async_checkpointing=config.async_save,
            lightweight_initialize=bool(self._unsafe),
        )
        # Handlers for every item up front: reading one item (or its metadata) then needs no
        # earlier save or restore of the others in this process.
        handlers = {name: ocp.StandardCheckpointHandler() for name in (*DEVICE_ITEMS, HOST)}
        handlers[META] = ocp.JsonCheckpointHandler()
        # orbax reads every step's metadata, damaged ones too, without raising
        with runlog.library_detail_to(self.log_file, collect=True):
            self._manager = ocp.CheckpointManager(
                self.directory, options=options, item_handlers=handlers
            )

    def all_steps(self) -> list[int]:
        return sorted(s for s in self._manager.all_steps() if str(s) not in self._unsafe)

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def prune(self) -> list[int]:
        """Delete the oldest steps beyond `max_to_keep` (orbax prunes only after a save, so a
        run killed between a save and its pruning, then resumed with nothing left to save,
        would keep one step too many); returns the steps deleted."""
        if self.read_only:
            raise ValueError("a read-only Checkpointer deletes nothing")
        self.wait()
        excess = self.all_steps()[: -self.config.max_to_keep]
        for step in excess:
            self._manager.delete(step)
        if excess:
            log.warning(
                "deleted checkpoint step(s) %s in %s: checkpoint.max_to_keep = %d",
                ", ".join(map(str, excess)),
                self.directory,
                self.config.max_to_keep,
            )
        return excess

    def damaged_dirs(self) -> list[Path]:
        """Steps moved aside as damaged (`<step>.damaged-<n>`), oldest step first."""
        if not self.directory.is_dir():
            return []
        found = [p for p in self.directory.iterdir() if _DAMAGED.match(p.name)]
        return sorted(found, key=lambda p: tuple(int(g) for g in _DAMAGED.match(p.name).groups()))

    # -- save ---------------------------------------------------------------------------
    def save(self, step: int, *, device: Mapping[str, Any], host: dict, meta: dict) -> None:
        """Write step `step`: the device items (`DEVICE_ITEMS`, all of them), `host` and `meta`.

        Raises `NonFiniteStateError` (writing nothing) if a device item holds NaN/Inf."""
        if self.read_only:
            raise ValueError("a read-only Checkpointer saves nothing")
        if set(device) != set(DEVICE_ITEMS):
            raise ValueError(f"device items must be {DEVICE_ITEMS}, got {sorted(device)}")
        path = self.directory / str(step)
        if os.path.lexists(path) and step not in self._manager.all_steps():
            # Not a step orbax committed (a file, a pipe, ...): orbax would delete it.
            why = step_unsafe(path) or "it is not a committed step"
            self._report(str(step), why, self._set_aside(str(step)), "writing the step anew")
        inspected = inspect_items(device)
        bad = [f"['{name}']{path}" for name, leaves in inspected.items()
               for path, (_, finite) in leaves.items() if not finite]  # fmt: skip
        if bad:
            raise NonFiniteStateError(
                f"refusing to checkpoint step {step}: non-finite values in {', '.join(bad[:5])}"
            )
        host = _to_numpy_tree(host)
        checksums = {
            name: {path: checksum for path, (checksum, _) in leaves.items()}
            for name, leaves in inspected.items()
        }
        checksums[HOST] = host_checksums(host)
        if "config" in meta:
            checksums["config"] = config_checksum(meta["config"])
        items = {name: ocp.args.StandardSave(tree) for name, tree in device.items()}
        items[HOST] = ocp.args.StandardSave(host)
        # The step is recorded inside the checkpoint: a step copied or renamed is then damage.
        items[META] = ocp.args.JsonSave({**meta, "step": int(step), "checksums": checksums})
        self.check_space(step, device, host)
        try:
            with runlog.library_detail_to(self.log_file):  # orbax's tracebacks of a failed write
                # force=True: the caller decides when to save (every M steps, at the end, Ctrl-C).
                self._manager.save(step, args=ocp.args.Composite(**items), force=True)
        except Exception as err:
            if not is_out_of_space(err):
                raise
            raise self._out_of_space(f"checkpoint step {step}", err) from err

    # -- disk space (reporting/disk_space.py) ---------------------------------------------
    def estimate_bytes(self, device: Mapping[str, Any], host: dict) -> int:
        """The disk space the next step will take: the newest committed step's, or (before the
        first save) the state's bytes plus orbax's overhead."""
        steps = self.all_steps()
        size = tree_bytes(self.directory / str(steps[-1])) if steps else 0
        raw = leaves_bytes([*jax.tree.leaves(dict(device)), *jax.tree.leaves(host)])
        return size or int(raw * _OVERHEAD_FACTOR) + _OVERHEAD_BYTES

    def check_space(self, step: int, device: Mapping[str, Any], host: dict) -> None:
        """Raise `DiskFullError` if step `step` cannot fit in the free space (nothing written);
        warn (once) when the steps `max_to_keep` keeps will not fit as the run goes on."""
        need, free = self.estimate_bytes(device, host), free_bytes(self.directory)
        if free < need:
            raise DiskFullError(
                f"checkpoint step {step} not written: it needs about {megabytes(need)} and "
                f"{self.directory} has {megabytes(free)} free"
            )
        keep = self.config.max_to_keep
        short = steady_state_shortfall(free, need, len(self.all_steps()), keep)
        if short and not self._space_warned:
            self._space_warned = True
            log.warning(
                "%s has %s free; checkpoint.max_to_keep = %d keeps %d steps of about %s and "
                "writes one more before it deletes the oldest: %s more than there is. The run "
                "will stop at a later save (exit 6) unless space is freed or max_to_keep lowered",
                self.directory, megabytes(free), keep, keep, megabytes(need), megabytes(short),
            )  # fmt: skip

    def intact_note(self) -> str:
        return intact_note(self.directory)

    def _out_of_space(self, what: str, err: BaseException) -> DiskFullError:
        """The one-line error for a write that ran out of space: orbax's partial step removed
        (earlier steps untouched), its detail in the log file."""
        self._manager_failed = True
        removed = remove_partials(self.directory) if multihost.is_primary() else []
        multihost.sync_hosts(f"checkpoint_out_of_space_{what}")
        runlog.append(self.log_file, f"{what}: out of space", err)  # room again: partial gone
        gone = f" (the partial {', '.join(removed)} was removed)" if removed else ""
        free = megabytes(free_bytes(self.directory))
        return DiskFullError(
            f"{what} not written: no space left on device, {free} free in {self.directory}{gone}"
        )

    # -- restore ------------------------------------------------------------------------
    def read_meta(self, step: int) -> dict:
        """The `meta` JSON of `step`; `DamagedStepError` if it cannot be read, lacks checksums or
        records another step (or if the step's layout is unsafe to read: `step_unsafe`)."""
        why = step_unsafe(self.directory / str(step))
        if why is not None:
            raise DamagedStepError(why)
        try:
            meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            meta = meta[META]
        except Exception as err:  # orbax raises many types for missing or damaged files
            raise DamagedStepError(f"its meta item cannot be read ({_short(err)})") from err
        if not isinstance(meta, dict) or "checksums" not in meta:
            raise DamagedStepError("its meta item has no checksums")
        if meta.get("step") != step:
            raise DamagedStepError(
                f"it records step {meta.get('step')}: a copy of another step, renamed"
            )
        config = meta.get("config")
        if config is not None and config_checksum(config) != meta["checksums"].get("config"):
            raise DamagedStepError("checksum mismatch in the saved config")
        return meta

    def restore(self, step: int, abstract: Mapping[str, Any], *, host: bool = True) -> Restored:
        """The device items named in `abstract` (item → template of ShapeDtypeStructs with
        shardings) and, if `host`, the host trees; every item's checksum verified.

        Raises `DamagedStepError` for damage, `LayoutError` if the step is intact but its items
        do not fit the templates."""
        meta = self.read_meta(step)
        try:
            saved = self._manager.item_metadata(step)
            layouts = {name: saved[name] for name in abstract}
        except Exception as err:
            raise DamagedStepError(f"its item metadata cannot be read ({_short(err)})") from err
        for name, template in abstract.items():
            if layouts[name] is None:
                raise DamagedStepError(f"its {name!r} item is missing")
            diff = _layout_differences(layouts[name].tree, template)
            if diff:
                raise LayoutError(
                    f"{self.directory / str(step)}: its {name!r} item does not fit this run "
                    f"({'; '.join(diff)})",
                    step,
                )
        items = {name: ocp.args.StandardRestore(t) for name, t in abstract.items()}
        if host:
            items[HOST] = ocp.args.StandardRestore()
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as err:
            raise DamagedStepError(f"its arrays cannot be read ({_short(err)})") from err
        want = meta["checksums"]
        inspected = inspect_items({name: out[name] for name in abstract})  # save's one program
        for name in abstract:
            got = {path: checksum for path, (checksum, _) in inspected[name].items()}
            bad = mismatches(want.get(name, {}), got)
            if bad:
                raise DamagedStepError(f"checksum mismatch in {name}{', '.join(bad[:3])}")
        host_trees = None
        if host:
            host_trees = dict(out[HOST])
            bad = mismatches(want.get(HOST, {}), host_checksums(host_trees))
            if bad:
                raise DamagedStepError(f"checksum mismatch in host{', '.join(bad[:3])}")
        return Restored(step, {name: out[name] for name in abstract}, host_trees, meta)

    def restore_latest(
        self,
        abstract: Mapping[str, Any],
        *,
        host: bool = True,
        check_meta: Callable[[int, dict], None] | None = None,
        move_damaged: bool = False,
    ) -> Restored | None:
        """The newest step that restores intact; None if there is no step at all.

        Damaged steps are reported and skipped; with `move_damaged` (a training run, which must
        be able to write those steps again) they are renamed `<step>.damaged-<n>`. `check_meta`
        sees each candidate's meta before its arrays are read and may raise (e.g. the config
        does not fit): that error propagates and nothing is moved. If steps existed but all were
        damaged (now, or moved aside by an earlier run), raises `CheckpointError`."""
        self.wait()
        skipped = [name for name in self._unsafe]
        for name, why in self._unsafe.items():
            self._report(name, why, None)
        with runlog.library_detail_to(self.log_file, collect=True):  # damaged steps are skipped
            for step in reversed(self.all_steps()):
                try:
                    meta = self.read_meta(step)
                    if check_meta is not None:
                        check_meta(step, meta)
                    restored = self.restore(step, abstract, host=host)
                    damage = None
                except DamagedStepError as err:
                    damage = str(err)
                    runlog.append(self.log_file, f"checkpoint step {step} is damaged", err)
                # Every process must agree before one of them moves the step aside.
                if _any_process(damage is not None):
                    where = self._set_aside(str(step)) if move_damaged else None
                    skipped.append(where.name if where else str(step))
                    self._report(str(step), damage or "on another process", where)
                    continue
                return restored
        aside = [p.name for p in self.damaged_dirs()]
        if skipped or aside:
            raise CheckpointError(
                f"{self.directory}: no intact checkpoint: every step is damaged "
                f"({', '.join(aside if move_damaged else skipped)})"
            )
        return None

    def _report(
        self, name: str, why: str, where: Path | None, then: str = "trying the previous one"
    ) -> None:
        """The one console line for a damaged step (its detail is in the log file)."""
        log.warning(
            "checkpoint step %s in %s is damaged (%s)%s; %s%s",
            name,
            self.directory,
            why,
            f", moved aside to {where.name}" if where else "",
            then,
            f" (details: {self.log_file})" if self.log_file and self.log_file.exists() else "",
        )

    def _set_aside(self, name: str, *, reload: bool = True) -> Path:
        """Rename step `name` (a directory, or whatever else bears a step's name) to
        `<name>.damaged-<n>` (first free n); every process calls this. Nothing is deleted."""
        if self.read_only:
            raise ValueError("a read-only Checkpointer moves nothing")
        multihost.sync_hosts(f"checkpoint_look_{name}")  # every process looks before any moves
        n = 1
        while os.path.lexists(self.directory / f"{name}.damaged-{n}"):
            n += 1
        target = self.directory / f"{name}.damaged-{n}"
        if multihost.is_primary():
            (self.directory / name).rename(target)
        multihost.sync_hosts(f"checkpoint_set_aside_{name}_{n}")
        if reload:
            # orbax re-reads every step's metadata: move any newly unsafe step aside first.
            for other, why in find_unsafe(self.directory).items():
                self._report(other, why, self._set_aside(other, reload=False))
            self._manager.reload()
        return target

    def wait(self) -> None:
        """Block until an async save has been committed (`DiskFullError` if it ran out of
        space)."""
        try:
            with runlog.library_detail_to(self.log_file):
                self._manager.wait_until_finished()
        except Exception as err:
            if not is_out_of_space(err):
                raise
            raise self._out_of_space("an asynchronous checkpoint save", err) from err

    def close(self) -> None:
        """Wait for a pending save and close; after a save that ran out of space, what orbax
        raises while closing goes to the log file (the run already said what happened)."""
        try:
            with runlog.library_detail_to(self.log_file):
                self._manager.wait_until_finished()
                self._manager.close()
        except Exception as err:
            if not self._manager_failed and not is_out_of_space(err):
                raise
            runlog.append(self.log_file, "closing the checkpointer after a failed save", err)


def _any_process(flag: bool) -> bool:
    """True if `flag` is set on any process (every process must call this at the same point)."""
    return bool(multihost.allgather_host(np.asarray(flag)).any())


def abstract_like(tree: Any) -> Any:
    """Shape/dtype/sharding template of `tree` for `Checkpointer.restore`."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
