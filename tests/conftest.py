"""Test-wide setup: simulate 8 CPU devices before JAX starts, so mesh tests can run anywhere."""

import os
from pathlib import Path

# Must happen before the first `import jax` anywhere in the test session.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Subprocesses (launch.py, multi-process workers, sidecars) import this tree's package, not
# whichever checkout an editable install points at.
_ROOT = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _ROOT]
)
