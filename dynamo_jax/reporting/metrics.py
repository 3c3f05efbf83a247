"""Per-step metrics: one JSON line per step in the workdir, TensorBoard scalars, a progress bar.

`metrics.jsonl` is the record plots and tests read. On resume the file is cut back to the
restored step, so a run that was killed and restarted leaves the same file as one that was not.
Values arrive as host scalars (the loop fetches the step's metric pytree once per step); a
non-finite value is written as a JSON string ("nan", "inf") rather than invalid JSON.

A record is flushed to the OS as it is written, so a run killed (kill -9) mid-write leaves at
most one torn last line; `read_metrics` skips it and the resume's `truncate_metrics` rewrites
the file without it. A write that finds the disk full (metrics.jsonl, or TensorBoard's events,
flushed by this thread after each step so the error surfaces here rather than in tensorboardX's
writer thread) raises `DiskFullError` naming the file and the free space.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dynamo_jax import validate
from dynamo_jax.errors import DiskFullError
from dynamo_jax.reporting.disk_space import free_bytes, is_out_of_space, megabytes

METRICS_FILE = "metrics.jsonl"
WANDB_MODES = ("", "online", "offline", "disabled")  # wandb.init's modes ("" = its default)
# tensorboardX's writer thread flushes every this many seconds: a week, i.e. never during a step
# (its queue poll takes the timeout in int32 milliseconds, so no larger).
_TB_NEVER_S = 7 * 24 * 3600


def _summary_writer_class():
    """tensorboardX's SummaryWriter, imported without torch where torch is not loaded yet.

    Its writer module tries `import torch` only to also accept torch tensors, which nothing here
    logs, and torch's import took 1.4 of the 1.55 s that importing tensorboardX took at every
    run's start (benchmarks/README.md#compile-time). For the length of that import, `torch` is
    marked missing in `sys.modules` (its `except ImportError` path); afterwards torch imports
    as usual.
    """
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
    try:
        from tensorboardX import SummaryWriter
    finally:
        if "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]
    return SummaryWriter


# The figures shown on the progress bar, in order, when present.
_BAR_KEYS = (
    ("reward/mean", "R"),
    ("temperature", "T"),
    ("entropy/mean", "H"),
    ("alloc/zero_var_share", "0var"),
    ("perf/tokens_per_s", "tok/s"),
)


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    """Where and how metrics are reported."""

    tensorboard: bool = True  # also write TensorBoard event files under workdir/tb
    progress_bar: bool = True  # tqdm bar with the key figures
    plots_at_end: bool = True  # write PNG plots into workdir/plots when the run ends
    # Weights & Biases (reporting/wandb_log.py): on when wandb_project is set. "" entity/mode =
    # wandb's own default (WANDB_ENTITY, WANDB_MODE); "" run name = the config's `name`.
    wandb_project: str = ""
    wandb_entity: str = ""
    wandb_run_name: str = ""
    wandb_tags: tuple[str, ...] = ()
    wandb_mode: str = ""  # "" | "online" | "offline" | "disabled"

    def __post_init__(self):
        for name in ("wandb_project", "wandb_entity", "wandb_run_name"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"logging.{name} must be a str, got {getattr(self, name)!r}")
        tags = self.wandb_tags
        if isinstance(tags, str):
            tags = (tags,) if tags else ()
        if not all(isinstance(t, str) and t for t in tags):
            raise ValueError(f"logging.wandb_tags must be non-empty strings, got {tags!r}")
        object.__setattr__(self, "wandb_tags", tuple(tags))
        validate.one_of("logging", "wandb_mode", self.wandb_mode, WANDB_MODES)


def _json_value(value: Any) -> Any:
    """Host scalar → JSON-safe value (NaN/Inf become strings so the line stays valid JSON)."""
    if isinstance(value, np.ndarray | np.generic):
        value = value.item() if np.ndim(value) == 0 else value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def read_metrics(workdir: str | Path) -> list[dict]:
    """All records of `workdir/metrics.jsonl`, in file order."""
    path = Path(workdir) / METRICS_FILE
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for lineno, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            # A run killed mid-write can leave a torn last line; anywhere else it is an error.
            if lineno == len(lines):
                break
            raise ValueError(f"{path}:{lineno}: not valid JSON ({err})") from err
    return records


def truncate_metrics(workdir: str | Path, last_step: int) -> None:
    """Keep only records with step <= last_step (the restored checkpoint's step)."""
    path = Path(workdir) / METRICS_FILE
    kept = [r for r in read_metrics(workdir) if int(r["step"]) <= last_step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    tmp.replace(path)


class MetricsWriter:
    """Appends step records to JSONL and TensorBoard and advances the progress bar."""

    def __init__(
        self,
        workdir: str | Path,
        config: LoggingConfig,
        *,
        total_steps: int,
        start_step: int,
        run_name: str = "",
        run_config: Mapping[str, Any] | None = None,
    ):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._file = (self.workdir / METRICS_FILE).open("a")
        self._wandb = None
        if config.wandb_project:
            from dynamo_jax.reporting.wandb_log import WandbLogger

            self._wandb = WandbLogger(
                self.workdir,
                project=config.wandb_project,
                entity=config.wandb_entity,
                run_name=config.wandb_run_name or run_name,
                tags=config.wandb_tags,
                mode=config.wandb_mode,
                run_config=run_config,
            )
        self._full = False  # a write found the disk full (close then drops what it cannot flush)
        self._tb = None
        if config.tensorboard:
            SummaryWriter = _summary_writer_class()
            # write() flushes after each step; the writer thread never flushes on its own
            # (a disk-full error there would kill the thread and then block the next step).
            # The event file is named by the second and the host, and opened for writing: a
            # resume in the same second replaced the earlier run's file; the process and the
            # start step in the name keep both.
            self._tb = SummaryWriter(
                str(self.workdir / "tb"),
                purge_step=start_step + 1,
                flush_secs=_TB_NEVER_S,
                filename_suffix=f".{os.getpid()}.{start_step}",
            )
        self._bar = None
        if config.progress_bar:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def write(self, step: int, values: Mapping[str, Any], *, advance: bool = True) -> None:
        """One record; `advance=False` (the before-training evaluation) leaves the bar alone."""
        record = {"step": int(step), **{k: _json_value(v) for k, v in values.items()}}
        with self._out_of_space(f"{self.workdir / METRICS_FILE}: step {step}'s record"):
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        if self._tb is not None:
            with self._out_of_space(f"{self.workdir / 'tb'}: step {step}'s TensorBoard events"):
                self._write_tb_scalars(step, record)
                self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(step, record)
        if self._bar is not None:
            shown = {
                short: f"{record[key]:.3g}"
                for key, short in _BAR_KEYS
                if isinstance(record.get(key), int | float)
            }
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(1 if advance else 0)

    def _write_tb_scalars(self, step: int, record: Mapping[str, Any]) -> None:
        """The record's numbers as one TensorBoard event: a summary with one value per key.

        `add_scalar` makes an event per key (and asks for a Comet logger each time): 100 steps of
        53 keys took 0.28-0.37 s that way and 0.06-0.09 s so (benchmarks/README.md). The values
        are `tensorboardX.summary.scalar`'s own, so TensorBoard reads the same scalars.
        `_get_file_writer` is the writer's own accessor (tensorboardX is pinned to 2.6).
        """
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.summary import scalar

        values = [
            scalar(key, value).value[0]
            for key, value in record.items()
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
        ]
        if values:
            self._tb._get_file_writer().add_summary(Summary(value=values), step)

    def message(self, text: str) -> None:
        """A line that does not break the progress bar."""
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    @contextlib.contextmanager
    def _out_of_space(self, what: str):
        """An out-of-space error inside the block as one `DiskFullError` naming `what`."""
        try:
            yield
        except OSError as err:
            if not is_out_of_space(err):
                raise
            self._full = True
            raise DiskFullError(
                f"{what} not written: no space left on device, "
                f"{megabytes(free_bytes(self.workdir))} free in {self.workdir}"
            ) from err

    def close(self) -> None:
        """Close the files (a W&B run stays open for `end`; after a disk-full error, what could not
        be flushed is dropped: the resume cuts the metrics back to its checkpoint anyway)."""
        try:
            self._file.close()
            if self._tb is not None:
                self._tb.close()
        except OSError as err:
            if not (self._full or is_out_of_space(err)):
                raise
        if self._bar is not None:
            self._bar.close()

    def end(self, summary: Mapping[str, Any], exit_code: int) -> None:
        """The end-of-run summary into W&B's run summary, and the W&B run finished."""
        if self._wandb is not None:
            self._wandb.finish(summary, exit_code)


class NullWriter:
    """`MetricsWriter`'s interface doing nothing: what non-primary processes of a multi-process
    run hold, so that metrics, TensorBoard and the progress bar are written once (process 0)."""

    def write(self, step: int, values: Mapping[str, Any], *, advance: bool = True) -> None:
        del step, values, advance

    def message(self, text: str) -> None:
        del text

    def close(self) -> None:
        pass

    def end(self, summary: Mapping[str, Any], exit_code: int) -> None:
        del summary, exit_code
