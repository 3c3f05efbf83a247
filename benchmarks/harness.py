"""What every benchmark shares: the timer, thread pinning, and the header that says where a
figure came from (the source revision and the machine's load average).

- `time_calls(fn, repeats=..., warmup=...)`: calls `fn` `warmup` times untimed (compilation,
  caches), then `repeats` times timed, each call's result blocked on until ready (JAX
  dispatches asynchronously: without the block a timer measures the dispatch, not the work).
  Returns a `Timing` with the median, min and max. `time_interleaved` times several
  functions round by round, so that passing load hits each alike.
- `pin_threads(threads)`: `threads == 1` sets the one-thread XLA flags. XLA reads `XLA_FLAGS`
  once, when its CPU backend starts, so this runs before `jax` is imported.
- `source_revision()`, `load_average()`, `header(title)`: the commit (and whether the tree
  differs from it) and the 1-minute load average, printed at the top of each script's output.

Scripts run from the repository root as `python -m benchmarks.<script>` (benchmarks/ is a
package, so this checkout's `dynamo_jax` and `configs` are importable with no path edits).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# XLA:CPU on one thread: Eigen's thread pool off, and one intra-op thread.
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds of each timed call, in call order, and of each untimed warm-up call."""

    seconds: tuple[float, ...]
    warmup_seconds: tuple[float, ...] = ()

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def min(self) -> float:
        return min(self.seconds)

    @property
    def max(self) -> float:
        return max(self.seconds)

    def __str__(self) -> str:
        return (
            f"median {self.median:.4g} s (min {self.min:.4g}, max {self.max:.4g}, "
            f"{len(self.seconds)} runs)"
        )


def block_until_ready(value: Any) -> Any:
    """`value` once every JAX array in it is computed; anything else passes through (a script
    that never imported JAX has no arrays to wait for, and does not import it here)."""
    jax = sys.modules.get("jax")
    return value if jax is None else jax.block_until_ready(value)


def time_calls(
    fn: Callable[[], Any],
    *,
    repeats: int,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> Timing:
    """Time `repeats` calls of `fn` after `warmup` untimed ones, each blocked until ready."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")

    def one() -> float:
        start = clock()
        block_until_ready(fn())
        return clock() - start

    warm = tuple(one() for _ in range(warmup))
    return Timing(seconds=tuple(one() for _ in range(repeats)), warmup_seconds=warm)


def time_interleaved(
    fns: dict[str, Callable[[], Any]],
    *,
    repeats: int,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Timing]:
    """{name: Timing} of `fns` called in turn, round after round (`warmup` untimed rounds, then
    `repeats` timed ones): load on a shared machine that comes and goes hits each alike."""
    rounds = [
        {
            name: time_calls(fn, repeats=1, warmup=0, clock=clock).seconds[0]
            for name, fn in fns.items()
        }
        for _ in range(warmup + repeats)
    ]
    return {
        name: Timing(
            seconds=tuple(r[name] for r in rounds[warmup:]),
            warmup_seconds=tuple(r[name] for r in rounds[:warmup]),
        )
        for name in fns
    }


def with_one_thread_flags(flags: str) -> str:
    """`flags` (an XLA_FLAGS value) with the one-thread flags added (for a child's env too)."""
    return f"{flags} {XLA_ONE_THREAD}".strip()


def pin_threads(threads: int) -> None:
    """Run XLA:CPU on one thread when `threads == 1` (any other value leaves XLA's defaults).
    Must run before `jax` is imported: XLA reads its flags once."""
    if threads != 1:
        return
    if "jax" in sys.modules:
        raise RuntimeError("pin_threads must run before jax is imported (XLA reads its flags once)")
    os.environ["XLA_FLAGS"] = with_one_thread_flags(os.environ.get("XLA_FLAGS", ""))


def source_revision(root: Path = ROOT) -> str:
    """The commit the benchmark runs at, and whether tracked files differ from it (tables cite
    it)."""
    git = ["git", "-C", str(root)]
    try:
        commit = subprocess.run(
            [*git, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "commit unknown (not a git checkout)"
    return f"commit {commit}" + (
        " + uncommitted changes to tracked files (dirty tree)" if dirty else " (clean tree)"
    )


def load_average() -> float:
    """The 1-minute load average (on a shared machine, what else ran beside the benchmark)."""
    return os.getloadavg()[0]


def header(title: str) -> str:
    """One line for the top of a script's output: what ran, at which commit, under what load."""
    xla_flags = os.environ.get("XLA_FLAGS", "").strip()
    return (
        f"{title} | {source_revision()} | load average {load_average():.2f} "
        f"({os.cpu_count()} CPUs)" + (f" | XLA_FLAGS {xla_flags}" if xla_flags else "")
    )
