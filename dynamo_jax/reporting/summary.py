"""The end of a run in a few lines: how it ended, how far it got, and where its outputs are.

`loop.train.run` returns a `RunSummary` and prints `format_summary` at the end of every run that
started training: finished, interrupted (SIGTERM/Ctrl-C), stopped on non-finite updates, or
failed. The exit status follows from it (`RunSummary.exit_code`, the table of
dynamo_jax/errors.py `ExitCode`).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from dynamo_jax.errors import ExitCode

REWARD_KEY = "reward/mean"


class Status(enum.Enum):
    """How a run ended."""

    FINISHED = "finished"
    INTERRUPTED = "interrupted"  # SIGTERM/Ctrl-C: checkpointed after the step, resumable
    ABORTED = "stopped at once"  # a second SIGTERM/Ctrl-C: the step in flight is lost
    NONFINITE = "stopped: non-finite updates"  # train.max_consecutive_nonfinite skipped in a row
    FAILED = "failed"  # an exception ended it


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What `loop.train.run` did in this launch."""

    name: str  # the config's run name
    workdir: Path
    status: Status
    reason: str  # one line saying why it stopped ("" when it finished)
    start_step: int  # the step this launch resumed from (0 for a fresh run)
    last_step: int  # the last step completed (== start_step if none was)
    total_steps: int  # train.steps
    checkpoint_step: int | None  # the newest committed checkpoint, if any
    skipped_updates: int  # non-finite updates skipped over the whole run
    tensorboard: bool  # TensorBoard events were written (logging.tensorboard)
    plots: bool  # PNG plots were written at the end (logging.plots_at_end)

    @property
    def exit_code(self) -> int:
        """launch.py's exit status for this ending (`ExitCode`)."""
        by_status = {
            Status.INTERRUPTED: ExitCode.INTERRUPTED,
            Status.ABORTED: ExitCode.ABORTED,
            Status.NONFINITE: ExitCode.NONFINITE,
            Status.FAILED: ExitCode.FAILED,
        }
        if self.status in by_status:
            return int(by_status[self.status])
        done = self.last_step >= self.total_steps
        return int(ExitCode.DONE if done else ExitCode.FAILED)


def reward_first_last(records: Sequence[dict], window: int = 5) -> tuple[str, str] | None:
    """('0.050 → 0.800', 'mean of steps 1-5 → 96-100') over `records` (metrics.jsonl), or None.

    Each side averages up to `window` steps, at most a fifth of the run each, so a short run
    compares its first and last step."""
    # Non-finite values are stored as strings ("nan"), so the type test drops them too.
    rows = [r for r in records if isinstance(r.get(REWARD_KEY), int | float)]
    rows = [r for r in rows if math.isfinite(r[REWARD_KEY])]
    if not rows:
        return None
    k = max(1, min(window, len(rows) // 5))
    first, last = rows[:k], rows[-k:]
    mean = lambda rs: sum(float(r[REWARD_KEY]) for r in rs) / len(rs)
    span = lambda rs: f"{rs[0]['step']}" if len(rs) == 1 else f"{rs[0]['step']}-{rs[-1]['step']}"
    return f"{mean(first):.3f} → {mean(last):.3f}", f"mean of steps {span(first)} → {span(last)}"


def last_eval(
    records: Sequence[dict], group: str, *, first: bool = False, prefix: str = "eval"
) -> tuple[int, dict[int, float]] | None:
    """(step, {k: pass@k}) of `group` (metrics `<prefix>/<group>/pass@k`) in the last (`first`:
    the first) record with an evaluation, or None."""
    pass_at = re.compile(rf"^{re.escape(prefix)}/{re.escape(group)}/pass@(\d+)$")
    for record in records if first else reversed(records):
        found = {}
        for key, value in record.items():
            match = pass_at.match(key)
            if match and isinstance(value, int | float):
                found[int(match.group(1))] = float(value)
        if found:
            return int(record["step"]), dict(sorted(found.items()))
    return None


def _headline(s: RunSummary) -> str:
    of = f"step {s.last_step} of {s.total_steps}"
    launch = ""
    if s.start_step and s.last_step > s.start_step:
        first = s.start_step + 1
        steps = f"step {first}" if first == s.last_step else f"steps {first}-{s.last_step}"
        launch = f" (resumed at step {s.start_step}; this launch ran {steps})"
    if s.status is Status.FINISHED:
        if s.last_step == s.start_step:
            return f"run {s.name} had already finished at {of}; nothing to do"
        return f"run {s.name} finished at {of}{launch}"
    if s.status is Status.INTERRUPTED:
        why = f" ({s.reason})" if s.reason else ""
        saved = "checkpointed" if s.checkpoint_step == s.last_step else "NOT checkpointed"
        if s.last_step == s.start_step:
            saved = "no step ran"
        return f"run {s.name} interrupted{why} after {of}{launch}; {saved}, rerun to resume"
    return f"run {s.name} {s.status.value} after {of}{launch}: {s.reason}"


def _eval_lines(records: Sequence[dict], group: str) -> list[str]:
    """The last evaluation's pass@k; when the base model was evaluated too (eval.at_start: step
    0), before → after, per group (difficulty level, benchmark) too, and greedy."""
    after = last_eval(records, group)
    if not after:
        return []
    before = last_eval(records, group, first=True)
    if before[0] != 0 or before[0] == after[0]:  # no base-model evaluation: the last one only
        shown = ", ".join(f"pass@{k} {v:.3f}" for k, v in after[1].items())
        return [f"  {'eval':<12} {shown}  (step {after[0]})"]
    change = lambda b, a: ", ".join(f"pass@{k} {b[k]:.3f} → {a[k]:.3f}" for k in a if k in b)
    lines = [f"  {'eval':<12} {change(before[1], after[1])}  (step {before[0]} → {after[0]})"]
    groups = sorted(
        {m.group(1) for r in records for key in r for m in [_GROUP.match(key)] if m} - {group}
    )
    for name in groups:
        b, a = last_eval(records, name, first=True), last_eval(records, name)
        if b and a and b[0] != a[0]:
            lines.append(f"  {'  ' + name:<12} {change(b[1], a[1])}")
    b = last_eval(records, group, first=True, prefix=GREEDY)
    a = last_eval(records, group, prefix=GREEDY)
    if b and a and b[0] != a[0]:
        lines.append(f"  {'greedy':<12} accuracy {b[1][1]:.3f} → {a[1][1]:.3f}")
    return lines


_GROUP = re.compile(r"^eval/([^/]+)/pass@\d+$")
GREEDY = "eval_greedy"  # evaluate.GREEDY (not imported: summary stays free of JAX)


def format_summary(s: RunSummary, records: Sequence[dict], eval_group: str) -> str:
    """The printed block: headline, reward first → last, the last eval's pass@k of
    `eval_group`, outputs, export command."""
    w = s.workdir
    lines = [_headline(s)]
    if s.status is Status.FINISHED and s.reason:
        lines[0] += f" ({s.reason})"
    reward = reward_first_last([r for r in records if int(r["step"]) <= s.last_step])
    lines.append(
        f"  {REWARD_KEY:<12} {reward[0]}  ({reward[1]})" if reward else "  no steps recorded"
    )
    lines += _eval_lines(records, eval_group)
    if s.skipped_updates:
        lines.append(f"  {'non-finite':<12} {s.skipped_updates} update(s) skipped")
    if s.checkpoint_step is None:
        lines.append(f"  {'checkpoint':<12} none written")
    else:
        lines.append(f"  {'checkpoint':<12} {w / 'checkpoints' / str(s.checkpoint_step)}")
    outputs = [f"{w / 'metrics.jsonl'}"]
    if s.tensorboard:
        outputs.append(f"TensorBoard: tensorboard --logdir {shlex.quote(str(w / 'tb'))}")
    if s.plots:
        outputs.append(f"plots: {w / 'plots'}")
    lines.append(f"  {'metrics':<12} {'; '.join(outputs)}")
    if s.checkpoint_step is not None:
        out = shlex.quote(str(w / f"hf_step{s.checkpoint_step}"))
        lines.append(f"  {'export':<12} python -m dynamo_jax.export {shlex.quote(str(w))} {out}")
    return "\n".join(lines)


def summary_values(s: RunSummary, records: Sequence[dict], eval_group: str) -> dict:
    """The end of the run as flat values (W&B's run summary, the exported model card): how it
    ended, how far it got, the reward first → last, the last evaluation's pass@k of every group
    (`final_eval/<group>/pass@k`, with `final_eval/step`)."""
    values: dict = {
        "run/status": s.status.value,
        "run/exit_code": s.exit_code,
        "run/last_step": s.last_step,
        "run/total_steps": s.total_steps,
        "run/skipped_updates": s.skipped_updates,
    }
    if s.reason:
        values["run/reason"] = s.reason
    if s.checkpoint_step is not None:
        values["run/checkpoint_step"] = s.checkpoint_step
    values.update(final_eval_values(records, eval_group))
    return values


def final_eval_values(records: Sequence[dict], eval_group: str) -> dict:
    """{"final_eval/step": step, "final_eval/<group>/pass@k": value} of the last evaluation."""
    after = last_eval(records, eval_group)
    if after is None:
        return {}
    values: dict = {"final_eval/step": after[0]}
    groups = {m.group(1) for r in records for key in r for m in [_GROUP.match(key)] if m}
    for group in sorted(groups | {eval_group}):
        found = last_eval(records, group)
        if found and found[0] == after[0]:
            for k, value in found[1].items():
                values[f"final_eval/{group}/pass@{k}"] = value
    return values
