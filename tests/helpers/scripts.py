"""Import a benchmark or script by its file path (benchmarks/ and scripts/ are not packages)."""

from __future__ import annotations

import importlib.util
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
