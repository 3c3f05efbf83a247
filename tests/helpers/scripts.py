"""Scripts run as a user runs them: a file imported by its path (scripts/ is not a package;
benchmarks/ is, and most of its tests import it as one), and launch.py as a subprocess."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(relative_path: str) -> ModuleType:
    """The module at ROOT/relative_path, registered under its stem (dataclasses and pickling
    look modules up in sys.modules)."""
    path = ROOT / relative_path
    name = path.stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def python_snippet(code: str, timeout: float = 120) -> str:
    """The standard output of `python -c code` in a fresh interpreter (what a new process
    imports, nothing this test session loaded); a failure shows its stderr's end."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=timeout)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def launch(*args: str, env: dict[str, str] | None = None, timeout: float = 600):
    """`python launch.py *args` from the repository root: the CompletedProcess, output captured
    as text (a test that hangs fails at `timeout` instead of blocking the tier)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
