"""Stage timings: each stage of a step measures itself and returns its seconds in its result.

A stage's result carries `timings`, a mapping of `time/<name>` to seconds; rl_step.py adds the
stages' mappings up into the step's `time/...` metrics (`add_timings`), so no stage writes into
another's dict.
"""

from __future__ import annotations

import time
from collections.abc import Mapping


class Stopwatch:
    """Seconds spent in a `with` block: `with Stopwatch() as clock: ...`, then `clock.seconds`."""

    seconds: float = 0.0

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._start


def add_timings(*parts: Mapping[str, float]) -> dict[str, float]:
    """The stages' timings as one mapping; a name measured more than once (dynamic sampling's
    further rounds generate and score again) is the sum."""
    out: dict[str, float] = {}
    for part in parts:
        for name, seconds in part.items():
            out[name] = out.get(name, 0.0) + seconds
    return out
