"""The weight push: trainer parameters → HF-named safetensors on shared memory → vLLM.

After every optimizer step the trainer's parameters must reach the vLLM sidecar. The path is
  1. export (`export_push_dir`): the models package's ONE name mapping (`hf_io.iter_hf_tensors`:
     per-head QKV, tied embeddings, layouts) gathers one tensor at a time to the host, converts
     it and appends it to one `model.safetensors` in a fresh directory under /dev/shm (RAM, no
     disk I/O), so the host never holds more than one tensor beyond the file itself;
  2. reload: the sidecar loads that directory in place and resets its prefix cache
     (`VLLMSidecarEngine.push_hf_dir`).
The directory is deleted once the next push has replaced it: the client keeps exactly one, so
a restarted sidecar can be given the current weights even after the trainer has donated the
device buffers they came from.

Multi-host: gathering a sharded parameter is a collective, so EVERY process must call
`export_push_dir` with the same arguments; only process 0 writes (the sidecar runs on the
host of process 0) and the others get None back.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import struct
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


def export_push_dir(
    params: Any, model_cfg: Any, root: str, version: int, dtype: str
) -> Path | None:
    """Write `params` as HF safetensors in a new directory under `root` (process 0 only).

    Streams `hf_io.iter_hf_tensors` (the one name mapping) into one file: a tensor is cast only
    when its dtype differs from `dtype` (on device, halving the transfer for float32 → bfloat16)
    and written from its own buffer, with no intermediate byte copy.
    """
    import jax
    import jax.numpy as jnp

    from dynamo_jax.models import hf_io

    if dtype not in _ST_DTYPES:
        raise ValueError(f"weight push dtype must be one of {sorted(_ST_DTYPES)}, got {dtype!r}")
    table = hf_io.hf_param_table(model_cfg)
    cast = None if jnp.dtype(model_cfg.param_dtype) == jnp.dtype(dtype) else dtype
    tensors = hf_io.iter_hf_tensors(params, model_cfg, dtype=cast)
    if jax.process_index() != 0:
        for _ in tensors:  # still take part in the cross-process gathers
            pass
        return None
    directory = Path(tempfile.mkdtemp(prefix=f"dynamo-push-v{version}-", dir=root))
    try:
        _write_safetensors(directory / WEIGHTS_FILE, table, tensors, dtype)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory


def _write_safetensors(path: Path, table, tensors, dtype: str) -> None:
    itemsize = np.dtype(_numpy_dtype(dtype)).itemsize
    header, offset = {}, 0
    for entry in table:
        nbytes = int(np.prod(entry.hf_shape)) * itemsize
        header[entry.hf_name] = {
            "dtype": _ST_DTYPES[dtype],
            "shape": list(entry.hf_shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for (name, arr), entry in zip(tensors, table, strict=True):
            if name != entry.hf_name or tuple(arr.shape) != tuple(entry.hf_shape):
                raise ValueError(
                    f"weight push: got {name} {arr.shape}, expected {entry.hf_name} {entry.hf_shape}"
                )
            arr = np.ascontiguousarray(arr.astype(_numpy_dtype(dtype), copy=False))
            f.write(arr.reshape(-1).view(np.uint8))  # bytes straight from the array's buffer


def _numpy_dtype(name: str):
    import ml_dtypes

    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


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
