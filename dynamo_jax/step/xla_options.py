"""XLA compile options of the trainer's programs: the train step and the log-prob pass.

XLA:CPU hands a program's matrix products either to YNNPACK fusions (its default in JAX 0.10)
or to its Eigen kernels. The trainer's products are large ([tokens, D] by [D, F] and their
transposes), and with Eigen the small-qwen3 update of benchmarks/peer_trl.py took 1-6% less
time on one thread and 4% less on two, SmolLM2-135M's 1% less on one (see
benchmarks/README.md#xla-cpu-matrix-libraries). The embedded engine's decode steps multiply
128-row blocks, where YNNPACK was 11% faster (SmolLM2: 7%), so its programs keep XLA's
default. The choice changes no formula, only how the products are blocked: the train step's
tests hold to their tolerances either way. Other platforms compile with no options.
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
