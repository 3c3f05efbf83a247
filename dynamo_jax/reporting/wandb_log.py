"""Weights & Biases beside TensorBoard: the same scalars, the resolved config, the run's summary.

On when `logging.wandb_project` is set. The run is `wandb.init(project, entity, name, tags,
mode, dir=WORKDIR, config=<the resolved config>)`; each step logs the numeric values TensorBoard
gets, at the same step; the end of the run writes the summary (how it ended, the last step, the
last evaluation's pass@k) into the run's summary and finishes it with the run's exit status.

The run id is kept in WORKDIR/wandb_run_id, so a resumed run continues the same W&B run
(`resume="allow"`). wandb keeps the first value logged at a step: steps that a killed run had
logged after its newest checkpoint are logged again on resume and dropped by wandb (metrics.jsonl
and TensorBoard are cut back instead).

A missing `wandb` package, or a failing `wandb.init` (no API key, no network in online mode), is
one line and the run goes on without W&B: a dashboard never stops training. With
`wandb_mode="offline"` (or WANDB_MODE=offline) the run's files are written under WORKDIR/wandb and
one line says how to upload them (`wandb sync`).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

RUN_ID_FILE = "wandb_run_id"


def numeric_scalars(record: Mapping[str, Any]) -> dict[str, float | int]:
    """The values of a metrics record TensorBoard gets too: ints and floats, not bools, no step."""
    return {
        key: value
        for key, value in record.items()
        if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
    }


def run_id(workdir: Path) -> str:
    """The W&B run id of this workdir: the saved one, else a new one (saved)."""
    file = workdir / RUN_ID_FILE
    if file.is_file():
        saved = file.read_text().strip()
        if saved:
            return saved
    new = secrets.token_hex(4)
    file.write_text(new + "\n")
    return new


class WandbLogger:
    """One W&B run for a workdir; every method is a no-op once it is off (`self.run is None`)."""

    def __init__(
        self,
        workdir: Path,
        *,
        project: str,
        entity: str = "",
        run_name: str = "",
        tags: tuple[str, ...] = (),
        mode: str = "",
        run_config: Mapping[str, Any] | None = None,
        say: Callable[[str], None] = print,
    ):
        self.run = None
        self._say = say
        try:
            import wandb
        except ImportError:
            say(
                "W&B: logging.wandb_project is set but wandb is not installed "
                "(pip install 'dynamo_jax[wandb]'); not logging to W&B"
            )
            return
        run_id_ = run_id(workdir)
        try:
            self.run = wandb.init(
                project=project,
                entity=entity or None,
                name=run_name or None,
                tags=list(tags) or None,
                mode=mode or None,
                dir=str(workdir),
                id=run_id_,
                resume="allow",
                config=dict(run_config or {}),
                settings=wandb.Settings(silent=True, console="off"),
            )
        except Exception as exc:  # anything wandb raises (auth, network, bad settings): one line
            first = next((ln for ln in str(exc).splitlines() if ln.strip()), "")
            say(f"W&B: wandb.init failed ({type(exc).__name__}: {first}); not logging to W&B")
            self.run = None
            return
        if getattr(self.run, "offline", False):
            files = Path(self.run.dir).parent  # the run's directory (run.dir is its files/)
            say(f"W&B: offline run {run_id_}, files in {files}; upload with `wandb sync {files}`")

    def log(self, step: int, record: Mapping[str, Any]) -> None:
        if self.run is None:
            return
        values = numeric_scalars(record)
        if values:
            self.run.log(values, step=int(step))

    def finish(self, summary: Mapping[str, Any], exit_code: int) -> None:
        """The run's summary (finite numbers and strings) and the end of the W&B run."""
        if self.run is None:
            return
        kept = {
            k: v
            for k, v in summary.items()
            if isinstance(v, str) or (isinstance(v, int | float) and math.isfinite(v))
        }
        try:
            self.run.summary.update(kept)
            self.run.finish(exit_code=int(exit_code))
        except Exception as exc:  # the run's end is reported already; W&B's failure is one line
            self._say(f"W&B: finishing the run failed ({type(exc).__name__}: {exc})")
        self.run = None
