"""The errors a user can fix by changing their input, as opposed to bugs.

`launch.py` prints a `UserError` as one or two plain lines (what is wrong, naming the field,
file, row or checkpoint) and exits non-zero; anything else is a bug and keeps its traceback.
Each class also derives from the built-in exception code already catches (ValueError,
RuntimeError), so callers that predate it keep working.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: the message alone tells the user what to change."""


class ConfigError(UserError, ValueError):
    """A config field (or a combination of fields) is invalid; the message names `section.field`."""


class DataError(UserError, ValueError):
    """A data file, row or field is unusable; the message names the file, the row and the field."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint or workdir cannot be used as asked; the message names the directory."""


class SidecarError(UserError, RuntimeError):
    """A rollout sidecar could not start or serve; the message names the sidecar and its log."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or directory the run needs is not there; the message names the path."""
