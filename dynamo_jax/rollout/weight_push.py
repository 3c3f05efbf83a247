"""The weight push: trainer parameters → HF-named host tensors → safetensors on shared memory.

After every optimizer step the trainer's parameters must reach the vLLM sidecar. The path is
  1. gather: device arrays → host NumPy (`gather_to_host`);
  2. convert: HF names, fused/split projections, tied embeddings, dtype — the models package's
     one mapping table, `dynamo_jax.models.hf_io.to_hf_tensors` (never a second copy here);
  3. write: one `model.safetensors` in a fresh directory under /dev/shm (RAM, no disk I/O);
  4. reload: the sidecar loads that directory in place (`VLLMSidecarEngine.push_hf_dir`).
The directory is deleted once the next push has replaced it (the sidecar client keeps exactly
one, so a restarted sidecar can be given the current weights even after the trainer has
donated the device buffers they came from).

Multi-host: with parameters sharded over several processes, `gather_to_host` is a collective
(`process_allgather`), so EVERY process must call it; only the process that runs the sidecar
(process 0 by default) then converts and writes.
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
    """Seconds per phase of one push, and the bytes written."""

    gather_s: float
    convert_s: float
    write_s: float
    reload_s: float
    nbytes: int

    @property
    def total_s(self) -> float:
        return self.gather_s + self.convert_s + self.write_s + self.reload_s


def gather_to_host(params: Any) -> Any:
    """The parameter tree as host NumPy arrays (a collective when several processes hold shards)."""
    import jax

    if jax.process_count() == 1:
        return jax.device_get(params)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(params, tiled=True)


def to_hf_host_tensors(host_params: Any, model_cfg: Any) -> dict[str, np.ndarray]:
    """HF-named tensors through the models package's mapping (the only name table)."""
    from dynamo_jax.models import hf_io

    return {name: np.asarray(t) for name, t in hf_io.to_hf_tensors(host_params, model_cfg).items()}


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


def tensors_nbytes(tensors: Mapping[str, np.ndarray]) -> int:
    return int(sum(np.asarray(t).nbytes for t in tensors.values()))


def timed(fn, *args):
    """(fn(*args), seconds)."""
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start
