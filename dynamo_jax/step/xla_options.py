"""XLA compile options of the trainer's programs: the train step and the log-prob pass.

XLA:CPU hands a program's matrix products either to YNNPACK fusions (its default in JAX 0.10)
or to its own Eigen emitter. The trainer's products are large ([tokens, D] by [D, F] and their
transposes): with Eigen its step took 3% less time at small-qwen3 on one thread, 2% less on
two, and 4% less at SmolLM2-135M on one. The embedded engine's decode steps multiply a few rows
at a time, where YNNPACK took 16% less time at small-qwen3 on two threads and 7% less at
SmolLM2 on one (5% more at small-qwen3 on one thread), so its programs keep XLA's default.
`python -m benchmarks.xla_cpu_dots` times both choices on both programs
(benchmarks/README.md#matrix-libraries-of-xla-on-cpu). The choice changes how products are blocked,
not what they compute: the train step's tests hold to their tolerances either way.
Other platforms compile with no options.
"""

from __future__ import annotations

from typing import Any

# An empty list of fusion kinds: no YNNPACK fusions, XLA's own (Eigen) dot emitter instead.
_CPU_TRAINER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


def trainer_compiler_options(mesh: Any) -> dict[str, str] | None:
    """The `compiler_options` of a trainer program that runs on `mesh`'s devices."""
    if mesh.devices.flat[0].platform == "cpu":
        return dict(_CPU_TRAINER_OPTIONS)
    return None
