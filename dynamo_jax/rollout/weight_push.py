"""The weight push: trainer parameters → HF-named safetensors on shared memory → vLLM.

After every optimizer step the trainer's parameters must reach the vLLM sidecar. The path is
  1. export (`export_push_dir`): the models package's ONE name mapping
     (`hf_io.write_hf_safetensors`: per-head QKV, tied embeddings, layouts) converts each
     parameter to HF layout and the push dtype ON DEVICE (one fused jitted op per parameter or
     chunk of layers), gathers it to the host as contiguous bytes and appends them to one
     `model.safetensors` in a fresh directory under /dev/shm (RAM, no disk I/O); the host holds
     at most one chunk (<= 256 MB) beyond the file itself;
  2. reload: the sidecar loads that directory in place and resets its prefix cache
     (`VLLMSidecarEngine.push_hf_dir`).
The directory is deleted once the next push has replaced it: the client keeps exactly one, so
a restarted sidecar can be given the current weights even after the trainer has donated the
device buffers they came from.

Multi-host: gathering a sharded parameter is a collective, so EVERY process must call
`export_push_dir` with the same arguments; each process writes its own directory on its own
host, for its own sidecar (rollout/process_split.py).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

WEIGHTS_FILE = "model.safetensors"


@dataclasses.dataclass(frozen=True)
class PushTimings:
    """Seconds of one push: export (gather + convert + write) and the sidecar's reload."""

    export_s: float
    reload_s: float
    nbytes: int

    @property
    def total_s(self) -> float:
        return self.export_s + self.reload_s


_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}  # safetensors codes


def export_push_dir(params: Any, model_cfg: Any, root: str, version: int, dtype: str) -> Path:
    """Write `params` as HF safetensors in a new directory under `root` (on every process).

    `hf_io.write_hf_safetensors` (the one name mapping) converts on device, one jitted call per
    parameter or chunk of layers (cast first, so a bfloat16 push moves half the bytes), and
    copies each chunk's contiguous host bytes straight into the file.
    """
    from dynamo_jax.models import hf_io

    if dtype not in _ST_DTYPES:
        raise ValueError(f"weight push dtype must be one of {sorted(_ST_DTYPES)}, got {dtype!r}")
    directory = Path(tempfile.mkdtemp(prefix=f"dynamo-push-v{version}-", dir=root))
    try:
        hf_io.write_hf_safetensors(directory / WEIGHTS_FILE, params, model_cfg, dtype)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory


def write_push_dir(tensors: Mapping[str, np.ndarray], root: str, version: int) -> Path:
    """Write `tensors` as one safetensors file in a new directory under `root`; return the dir."""
    from safetensors.numpy import save_file

    if not tensors:
        raise ValueError("weight push: no tensors to write")
    directory = Path(tempfile.mkdtemp(prefix=f"dynamo-push-v{version}-", dir=root))
    try:
        # safetensors needs C-contiguous buffers; transposed views from the mapping are not.
        save_file(
            {k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(directory / WEIGHTS_FILE)
        )
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory


def timed(fn, *args):
    """(fn(*args), seconds)."""
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start
