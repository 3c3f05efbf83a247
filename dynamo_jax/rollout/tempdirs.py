"""The private temporary directory of each vLLM sidecar, and its clean-up after a SIGKILL.

A sidecar's Unix socket and vLLM's own temporary files live in a private (0700) directory under
the system temp dir, `dynamo-sidecar-*` (socket paths are limited to ~100 bytes, so not in the
workdir). The engine's `close` removes it, but a trainer killed with SIGKILL runs no Python and it
stays behind (~150 MB of vLLM files per run). So each one is recorded in the workdir,
`<workdir>/.sidecar_tmp/<name>.json` (the path, the owning process id and that process's start
time), and a later run of the same workdir removes the directories whose owner is gone
(`remove_stale`, called before a sidecar starts).

Nothing that is not ours is removed: only a path this workdir recorded, named `dynamo-sidecar-*`,
directly inside the temp dir it was made in, a real directory (not a link) owned by this user.
A record whose owner is alive (another run of the same workdir, the fleet's other sidecars) is
left as it is; so is one of another host (multi-host runs share the workdir, not /tmp).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)
PREFIX = "dynamo-sidecar-"
REGISTRY = ".sidecar_tmp"


def _start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (Linux /proc; None elsewhere or if it is gone): with the
    pid it names one process, so a pid reused by another process is not mistaken for ours."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to judge, keep its directory
    now = _start_time(pid)
    return start is None or now is None or now == start


def make(workdir: str | os.PathLike) -> str:
    """A new private temporary directory, recorded in `workdir` with this process as owner."""
    path = tempfile.mkdtemp(prefix=PREFIX)
    registry = Path(workdir) / REGISTRY
    registry.mkdir(parents=True, exist_ok=True)
    record = {
        "path": path,
        "tmp_root": str(Path(path).parent),
        "pid": os.getpid(),
        "start_time": _start_time(os.getpid()),
        "host": socket.gethostname(),
        "uid": os.getuid(),
    }
    tmp = registry / f".{Path(path).name}.json.tmp"
    tmp.write_text(json.dumps(record))
    tmp.rename(registry / f"{Path(path).name}.json")  # a reader never sees half a record
    return path


def forget(workdir: str | os.PathLike, path: str) -> None:
    """Drop the record of `path` (after the directory itself was removed)."""
    (Path(workdir) / REGISTRY / f"{Path(path).name}.json").unlink(missing_ok=True)


def _ours(record: dict) -> Path | None:
    """The recorded directory if every check says it is ours to remove, else None."""
    path = Path(str(record.get("path", "")))
    root = Path(str(record.get("tmp_root", "")))
    if not path.name.startswith(PREFIX) or path.parent != root or not root.is_absolute():
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return None
    return path


def remove_stale(workdir: str | os.PathLike) -> list[Path]:
    """Remove the temporary directories recorded in `workdir` whose owner process is gone (and
    their records); returns the directories removed."""
    registry = Path(workdir) / REGISTRY
    if not registry.is_dir():
        return []
    removed = []
    for entry in sorted(registry.glob(f"{PREFIX}*.json")):
        try:
            record = json.loads(entry.read_text())
            pid = int(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a record we wrote: leave it
        if record.get("host") != socket.gethostname() or _alive(pid, record.get("start_time")):
            continue
        path = _ours(record)
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.lexists(path):
                removed.append(path)
        elif os.path.lexists(str(record.get("path", ""))):
            log.warning("left %s in place: recorded by %s but not ours to remove", record["path"],
                        entry)  # fmt: skip
            continue
        entry.unlink(missing_ok=True)
    if removed:
        log.warning(
            "removed %d temporary sidecar dir(s) a killed run of %s left: %s",
            len(removed), workdir, ", ".join(map(str, removed)),
        )  # fmt: skip
    return removed
