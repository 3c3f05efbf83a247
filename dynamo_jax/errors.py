"""The exit statuses of `python launch.py`, and the errors a user can act on (as opposed to bugs).

The one exit-status contract (docs/exit_codes.md is its user-facing copy; tests/test_exit_codes.py
runs every row):

    0 DONE         the run reached train.steps (or had already reached it)
    1 FAILED       it failed while running: a bug (with its traceback), or a known failure such
                   as a rollout sidecar that kept dying after its restarts (one line)
    2 REFUSED      refused before anything changed: bad flags, config, data, workdir, mesh,
                   a checkpoint this config cannot continue (one or two lines, no traceback)
    3 INTERRUPTED  SIGTERM or Ctrl-C: the step in flight finished, a checkpoint was saved;
                   rerun the same command to resume
    4 NONFINITE    stopped after train.max_consecutive_nonfinite non-finite updates in a row
                   (the last finite state is the newest checkpoint)
    5 ABORTED      a second SIGTERM/Ctrl-C: stopped at once, the step in flight is lost; rerun
                   to resume from the newest checkpoint
    6 NO_SPACE     the workdir's filesystem is full (or too full for the next checkpoint): one
                   line says what was not written, the free space and the intact step; free
                   space and rerun to resume

`launch.py` prints a `UserError` as one or two plain lines (what is wrong, naming the field,
file, row or checkpoint) and exits with its `exit_code`; anything else is a bug and keeps its
traceback. Each class also derives from the built-in exception code already catches
(ValueError, RuntimeError), so callers that predate it keep working.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """launch.py's exit statuses (the table above)."""

    DONE = 0
    FAILED = 1
    REFUSED = 2
    INTERRUPTED = 3
    NONFINITE = 4
    ABORTED = 5
    NO_SPACE = 6


class UserError(Exception):
    """Bad input: the message alone tells the user what to change."""

    exit_code = ExitCode.REFUSED


class ConfigError(UserError, ValueError):
    """A config field (or a combination of fields) is invalid; the message names `section.field`."""


class DataError(UserError, ValueError):
    """A data file, row or field is unusable; the message names the file, the row and the field."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint or workdir cannot be used as asked; the message names the directory."""


class WorkdirInUseError(CheckpointError):
    """Another run holds the workdir's lock; the message names its pid, host and start time."""


class SidecarError(UserError, RuntimeError):
    """A rollout sidecar could not start or serve; the message names the sidecar and its log."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or directory the run needs is not there; the message names the path."""


class RunFailedError(UserError, RuntimeError):
    """A known failure after training started (a sidecar that kept dying, a data file that
    became unreadable): one line like a `UserError`, but the run had begun, so FAILED."""

    exit_code = ExitCode.FAILED


class DiskFullError(UserError, OSError):
    """The workdir's filesystem has no room for a checkpoint, a metrics record or a TensorBoard
    event: the message says what was not written, the free space, and which step is intact."""

    exit_code = ExitCode.NO_SPACE
