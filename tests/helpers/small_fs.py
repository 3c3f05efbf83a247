"""A real small filesystem for the disk-full tests: a tmpfs of a few MB mounted on a test's
directory (root only; elsewhere the test is skipped, saying why), and a filler that leaves it
with a chosen number of free bytes."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_fs(where: Path, size: str) -> Iterator[Path]:
    """`where`, a tmpfs of `size` (e.g. "8m") for the block; skips the test where it cannot."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the injected-ENOSPC tests cover this")
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def resize(where: Path, size: str) -> None:
    """Grow (or shrink) the tmpfs at `where` in place: "space was freed"."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True)


def fill(path: Path, leave: int = 0) -> None:
    """Write `path` until its filesystem has at most `leave` bytes free."""
    with open(path, "ab", buffering=0) as f:
        block = b"\0" * 65536
        while len(block) >= 1:
            st = os.statvfs(path)
            room = st.f_bavail * st.f_frsize - leave
            if room <= 0:
                return
            try:
                f.write(block[: min(len(block), room)])
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                block = block[: len(block) // 2]
