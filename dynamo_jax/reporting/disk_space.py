"""How much room a filesystem has, how much a directory takes, and whether an error means "full".

A full disk must end a run with one line (errors.py `DiskFullError`), not with the tracebacks of
whichever library was writing: orbax/tensorstore report it as `ValueError("RESOURCE_EXHAUSTED:
... No space left on device [os_error_code='28']")`, Python's own writes as `OSError(ENOSPC)`,
a quota as EDQUOT. `is_out_of_space` recognises all of them anywhere in an exception's chain.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

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
