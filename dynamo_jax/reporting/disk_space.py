"""How much room a filesystem has, how much a directory takes, and whether an error means "full".

A full disk must end a run with one line (errors.py `DiskFullError`), not with the tracebacks of
whichever library was writing: orbax/tensorstore report it as `ValueError("RESOURCE_EXHAUSTED:
... No space left on device [os_error_code='28']")`, Python's own writes as `OSError(ENOSPC)`,
a quota as EDQUOT. `is_out_of_space` recognises all of them anywhere in an exception's chain.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# What tensorstore's messages carry when the OS said ENOSPC / EDQUOT.
_FULL_TEXTS = (
    "No space left on device",
    "Disk quota exceeded",
    f"os_error_code='{errno.ENOSPC}'",
    f"os_error_code='{errno.EDQUOT}'",
)


def free_bytes(path: str | Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path` (or its
    nearest existing parent): statvfs's f_bavail, what `df` shows as available."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def tree_bytes(path: str | Path) -> int:
    """The disk space the files under `path` take (allocated blocks, not apparent sizes);
    entries that vanish while it looks count as 0."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def is_out_of_space(err: BaseException) -> bool:
    """True if `err`, or an exception it was raised from, says the filesystem is full."""
    seen: list[BaseException] = []
    while err is not None and err not in seen:
        seen.append(err)
        if isinstance(err, OSError) and err.errno in _FULL_ERRNOS:
            return True
        if any(text in str(err) for text in _FULL_TEXTS):
            return True
        err = err.__cause__ or err.__context__
    return False


def megabytes(n: int) -> str:
    """`n` bytes as "1.4 MB" (decimal megabytes, as `df -H` shows them)."""
    return f"{n / 1e6:.1f} MB"


# ----------------------------------------------------------------------------- checkpoints

PARTIAL = ".orbax-checkpoint-tmp"  # orbax writes step N into N.orbax-checkpoint-tmp*, then renames
_STEP = re.compile(r"^\d+$")


def leaves_bytes(leaves: list[Any]) -> int:
    """The bytes of arrays (JAX or NumPy) and scalars."""
    return sum(int(x.nbytes) if hasattr(x, "nbytes") else np.asarray(x).nbytes for x in leaves)


def steady_state_shortfall(free: int, need: int, kept: int, max_to_keep: int) -> int:
    """Bytes missing for the steps `max_to_keep` keeps plus the one orbax writes before it
    deletes the oldest, each of `need` bytes, `kept` of them on disk already (0: they fit)."""
    return max(0, (max_to_keep + 1 - kept) * need - free)


def remove_partials(directory: Path) -> list[str]:
    """Delete orbax's uncommitted step directories in `directory`; returns their names."""
    removed = []
    for partial in sorted(Path(directory).glob(f"*{PARTIAL}*")):
        shutil.rmtree(partial, ignore_errors=True)
        removed.append(partial.name)
    return removed


def intact_note(directory: Path) -> str:
    """What a disk-full line says about the committed steps in `directory` and what to do."""
    steps = sorted(int(p.name) for p in Path(directory).iterdir() if _STEP.match(p.name))
    where = f"step {steps[-1]} is intact" if steps else "no step was saved yet"
    return (
        f"{where}. Free space on that filesystem (or lower checkpoint.max_to_keep), then rerun "
        "the same command to resume."
    )
