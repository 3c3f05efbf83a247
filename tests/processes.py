"""Helpers for tests that run several cooperating subprocesses (multi-process JAX jobs)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence


def communicate_all(
    procs: Sequence[subprocess.Popen], names: Sequence[str], timeout: float
) -> list[str]:
    """Wait for every process and return their outputs; kill any left running (a peer left
    behind would join the next run's coordinator); fail naming the first that did not exit 0."""
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for name, p, out in zip(names, procs, outputs, strict=True):
        assert p.returncode == 0, f"{name} failed:\n{out[-4000:]}"
    return outputs
