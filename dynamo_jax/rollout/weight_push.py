"""The weight push: trainer parameters → HF-named safetensors on shared memory → vLLM, verified.

After every optimizer step the trainer's parameters must reach every vLLM sidecar. The path is
  1. export (`export_push_dir`), ONCE per host: the models package's ONE name mapping
     (`hf_io.write_hf_safetensors`: per-head QKV, tied embeddings, layouts) converts each
     parameter to HF layout and the push dtype ON DEVICE (one fused jitted op per parameter or
     chunk of layers), gathers it to the host as contiguous bytes and appends them to one
     `model.safetensors` in a fresh directory under /dev/shm (RAM, no disk I/O); the host holds
     at most one chunk (<= 256 MB) beyond the file itself;
  2. reload: every sidecar of the host loads that same directory in place and resets its prefix
     cache (`VLLMSidecarEngine.load_push`);
  3. verification: every sidecar reads a few named tensors back from its engine (each
     tensor-parallel rank its own part) and the digests of their bytes are compared with those
     of the same tensors in the pushed file (`PushDir.expected_digest`, computed once per push;
     a tensor above 2M elements on every k-th row, `wire.digest_step`, to bound the cost;
     `compare_fingerprints`).
     vLLM's in-place reload has open reports of serving stale weights (vLLM issue 32718) and of
     garbage after a layerwise reload; a mismatch is an error naming the sidecar and the tensor.
The directory is deleted once the next push has replaced it: the host keeps exactly one, so a
restarted sidecar can be given the current weights even after the trainer has donated the
device buffers they came from.

Directories are named `dynamo-push-<tag>-v<version>-*`, the tag a hash of (workdir, process),
so a run restarted after a SIGKILL (which runs no cleanup) removes its predecessor's leftovers
(`remove_stale_push_dirs`) without touching other runs'.

Multi-host: gathering a sharded parameter is a collective, so EVERY process must call
`export_push_dir` with the same arguments; each process writes its own directory on its own
host, for its own sidecars (rollout/process_split.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dynamo_jax.errors import SidecarError
from dynamo_jax.rollout import wire

log = logging.getLogger(__name__)
WEIGHTS_FILE = "model.safetensors"
PREFIX = "dynamo-push-"


@dataclasses.dataclass(frozen=True)
class PushTimings:
    """Seconds of one push: export (gather + convert + write, once per host), the sidecars'
    reload and the verification (slowest sidecar of the host for both), and the bytes written."""

    export_s: float
    reload_s: float
    nbytes: int
    verify_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.export_s + self.reload_s + self.verify_s


_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}  # safetensors codes


def _numpy_dtype(name: str) -> np.dtype:
    """A safetensors code (F32, BF16, F16) or a torch dtype name (torch.bfloat16) as numpy's."""
    import ml_dtypes

    table = {
        "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64,
        "torch.float32": np.float32, "torch.float16": np.float16,
        "torch.bfloat16": ml_dtypes.bfloat16, "torch.float64": np.float64,
    }  # fmt: skip
    if name not in table:
        raise ValueError(f"weight verification: unsupported dtype {name!r}")
    return np.dtype(table[name])


def push_tag(workdir: str | os.PathLike, process_index: int) -> str:
    """The tag in this (workdir, process)'s push directory names."""
    key = f"{Path(workdir).resolve()}:{int(process_index)}"
    return hashlib.blake2b(key.encode(), digest_size=6).hexdigest()


def remove_stale_push_dirs(shm_dir: str | os.PathLike, tag: str) -> list[Path]:
    """Delete push directories a previous run with this tag left behind; returns them."""
    stale = sorted(Path(shm_dir).glob(f"{PREFIX}{tag}-v*"))
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    if stale:
        log.warning("removed %d stale weight-push dir(s) of this run in %s", len(stale), shm_dir)
    return stale


def check_names(names: Sequence[str]) -> list[str]:
    """The pushed tensors every sidecar reads back after a push: the final norm, the embedding
    and output head, and every tensor of the first, middle and last layer (the engine reports
    the ones it fuses or repacks as such; the rest are compared)."""
    found = [re.match(r"model\.layers\.(\d+)\.", n) for n in names]
    num_layers = 1 + max((int(m.group(1)) for m in found if m), default=0)
    layers = sorted({0, num_layers // 2, num_layers - 1})
    wanted = {"model.norm.weight", "model.embed_tokens.weight", "lm_head.weight"}
    prefixes = tuple(f"model.layers.{i}." for i in layers)
    return sorted(n for n in names if n in wanted or n.startswith(prefixes))


@dataclasses.dataclass
class PushDir:
    """One pushed directory and what verification needs from it (shared by a host's sidecars).

    `owned` pushes are deleted by the engine that loads them when superseded; a fleet's shared
    push is deleted by the fleet.
    """

    directory: Path
    version: int
    nbytes: int
    export_s: float
    _digests: dict = dataclasses.field(default_factory=dict, repr=False)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    @property
    def file(self) -> Path:
        return self.directory / WEIGHTS_FILE

    def header(self) -> dict[str, dict]:
        return wire.safetensors_header(self.file)[0]

    def check_names(self) -> list[str]:
        return check_names(list(self.header()))

    def expected_digest(self, name: str, local_shape: list[int], rank: int, dtype: str) -> str:
        """The digest of the part of tensor `name` that a rank holding `local_shape` in `dtype`
        should hold, from the pushed file; "" when no rank can hold that shape."""
        key = (name, tuple(local_shape), int(rank), dtype)
        with self._lock:  # the host's sidecars verify concurrently; each digest is made once
            if key not in self._digests:
                self._digests[key] = self._digest(name, local_shape, rank, dtype)
            return self._digests[key]

    def _digest(self, name: str, local_shape: list[int], rank: int, dtype: str) -> str:
        header, data_start = wire.safetensors_header(self.file)
        info = header[name]
        region = wire.shard_region(info["shape"], list(local_shape), rank)
        if region is None:
            return ""
        begin, end = info["data_offsets"]
        full = np.memmap(
            self.file, _numpy_dtype(info["dtype"]), "r", data_start + begin, tuple(info["shape"])
        )
        if full.nbytes != end - begin:
            raise ValueError(
                f"{self.file}: tensor {name} has {end - begin} bytes, not {full.nbytes}"
            )
        dim, start, size = region
        part = full[(slice(None),) * dim + (slice(start, start + size),)] if full.ndim else full
        part = part[:: wire.digest_step(list(part.shape))] if part.ndim else part
        data = np.ascontiguousarray(part.astype(_numpy_dtype(dtype), copy=False))
        return wire.digest(data.reshape(-1).view(np.uint8))

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def export_push_dir(
    params: Any, model_cfg: Any, root: str, version: int, dtype: str, tag: str = "local"
) -> PushDir:
    """Write `params` as HF safetensors in a new directory under `root` (on every process).

    `hf_io.write_hf_safetensors` (the one name mapping) converts on device, one jitted call per
    parameter or chunk of layers (cast first, so a bfloat16 push moves half the bytes), and
    copies each chunk's contiguous host bytes straight into the file.
    """
    from dynamo_jax.models import hf_io

    if dtype not in _ST_DTYPES:
        raise ValueError(f"weight push dtype must be one of {sorted(_ST_DTYPES)}, got {dtype!r}")
    start = time.perf_counter()
    directory = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{tag}-v{version}-", dir=root))
    try:
        nbytes = hf_io.write_hf_safetensors(directory / WEIGHTS_FILE, params, model_cfg, dtype)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return PushDir(directory, int(version), nbytes, time.perf_counter() - start)


def write_push_dir(
    tensors: Mapping[str, np.ndarray], root: str, version: int, tag: str = "local"
) -> PushDir:
    """Write HF-named host `tensors` as one safetensors file in a new directory under `root`."""
    from safetensors.numpy import save_file

    if not tensors:
        raise ValueError("weight push: no tensors to write")
    start = time.perf_counter()
    directory = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{tag}-v{version}-", dir=root))
    try:
        # safetensors needs C-contiguous buffers; transposed views from the mapping are not.
        save_file(
            {k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(directory / WEIGHTS_FILE)
        )
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    nbytes = (directory / WEIGHTS_FILE).stat().st_size
    return PushDir(directory, int(version), nbytes, time.perf_counter() - start)


def compare_fingerprints(push: PushDir, reply: dict, where: str) -> int:
    """Check a `fingerprint` reply (every rank's digests of the tensors it read back) against
    the pushed file; returns how many were compared. SidecarError names the first mismatch."""
    if reply["weight_version"] != push.version:
        raise SidecarError(
            f"{where} reports weight version {reply['weight_version']} after the push of "
            f"version {push.version}"
        )
    compared = 0
    for rank in reply["ranks"]:
        for name, got in sorted(rank["tensors"].items()):
            if got["state"] != "ok":
                continue  # fused or repacked inside vLLM: not readable by name
            want = push.expected_digest(name, got["shape"], rank["rank"], got["dtype"])
            if not want or got["digest"] != want:
                raise SidecarError(
                    f"{where} does not serve the pushed weights of version {push.version}: "
                    f"tensor {name} (tensor-parallel rank {rank['rank']}, shape {got['shape']}, "
                    f"{got['dtype']}) read back from vLLM differs from {push.file}"
                )
            compared += 1
    if not compared:
        raise SidecarError(
            f"{where}: verification of the push of version {push.version} could not read any of "
            f"{len(push.check_names())} tensors back from vLLM"
        )
    return compared
