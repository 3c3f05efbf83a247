"""Hugging Face checkpoint import/export for the Qwen decoder.

`hf_param_table(cfg)` is the ONE mapping between HF tensor names and the Flax parameter tree
(path, layer index for stacked layers, and how the matrix is laid out). Import, export and the
weight push to the rollout sidecar (`to_hf_tensors` / `iter_hf_tensors`) all use it.

Layouts ("kind"): HF Linear weights are [out, in]; ours are [in, ...out] split per head:
    copy        same array                      (embedding, norms)
    linear      W.T                             (mlp, lm_head)
    heads_in    W.T.reshape(D, heads, E)        (q/k/v_proj.weight)
    heads_bias  b.reshape(heads, E)             (q/k/v_proj.bias)
    heads_out   W.T.reshape(H, E, D)            (o_proj.weight)

Import places every parameter directly with its target sharding (make_array_from_callback):
the host holds one stacked parameter at a time, in the file's dtype, never a per-device copy.
Export streams one tensor at a time into a single safetensors file.

A model directory that cannot be imported is an error naming the file: `ConfigError` for
config.json (unreadable, not a JSON object, missing or invalid fields), `DataError` for the
weights (a truncated or otherwise unreadable safetensors file, a bad index, a missing or
misshaped tensor), FileNotFoundError for absent files.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open

from dynamo_jax.errors import ConfigError, DataError, MissingFileError
from dynamo_jax.models.config import ModelConfig
from dynamo_jax.models.files import read_json_object
from dynamo_jax.models.qwen import param_shapes

_LAYER_ENTRIES = (
    # (HF name inside model.layers.{i}., path inside one layer, kind, only_if)
    ("self_attn.q_proj.weight", ("attn", "q_proj", "kernel"), "heads_in", None),
    ("self_attn.k_proj.weight", ("attn", "k_proj", "kernel"), "heads_in", None),
    ("self_attn.v_proj.weight", ("attn", "v_proj", "kernel"), "heads_in", None),
    ("self_attn.q_proj.bias", ("attn", "q_proj", "bias"), "heads_bias", "qkv_bias"),
    ("self_attn.k_proj.bias", ("attn", "k_proj", "bias"), "heads_bias", "qkv_bias"),
    ("self_attn.v_proj.bias", ("attn", "v_proj", "bias"), "heads_bias", "qkv_bias"),
    ("self_attn.o_proj.weight", ("attn", "o_proj", "kernel"), "heads_out", None),
    ("self_attn.q_norm.weight", ("attn", "q_norm", "scale"), "copy", "qk_norm"),
    ("self_attn.k_norm.weight", ("attn", "k_norm", "scale"), "copy", "qk_norm"),
    ("mlp.gate_proj.weight", ("mlp", "gate_proj", "kernel"), "linear", None),
    ("mlp.up_proj.weight", ("mlp", "up_proj", "kernel"), "linear", None),
    ("mlp.down_proj.weight", ("mlp", "down_proj", "kernel"), "linear", None),
    ("input_layernorm.weight", ("input_norm", "scale"), "copy", None),
    ("post_attention_layernorm.weight", ("post_attn_norm", "scale"), "copy", None),
)
_TOP_ENTRIES = (
    ("model.embed_tokens.weight", ("embed", "embedding"), "copy", None),
    ("model.norm.weight", ("final_norm", "scale"), "copy", None),
    ("lm_head.weight", ("lm_head", "kernel"), "linear", "untied"),
)
_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


@dataclasses.dataclass(frozen=True)
class HFTensor:
    """One HF tensor ↔ one parameter (or one layer of a stacked parameter)."""

    hf_name: str
    path: tuple[str, ...]  # path in the Flax params tree
    layer: int | None  # index along the stacked `layers` axis, None if not stacked
    kind: str
    shape: tuple[int, ...]  # the Flax shape of this (per-layer) piece

    @property
    def hf_shape(self) -> tuple[int, ...]:
        s = self.shape
        if self.kind == "linear":
            return s[::-1]
        if self.kind == "heads_in":
            return (s[1] * s[2], s[0])
        if self.kind == "heads_bias":
            return (s[0] * s[1],)
        if self.kind == "heads_out":
            return (s[2], s[0] * s[1])
        return s

    def to_flax(self, w: np.ndarray) -> np.ndarray:
        if self.kind in ("linear", "heads_in", "heads_out"):
            w = w.T
        return w.reshape(self.shape)

    def to_hf(self, p: np.ndarray) -> np.ndarray:
        if self.kind == "heads_in":
            p = p.reshape(p.shape[0], -1)
        elif self.kind == "heads_out":
            p = p.reshape(-1, p.shape[-1])
        elif self.kind == "heads_bias":
            p = p.reshape(-1)
        if self.kind in ("linear", "heads_in", "heads_out"):
            p = p.T
        return np.ascontiguousarray(p)


def hf_param_table(cfg: ModelConfig) -> list[HFTensor]:
    """Every HF tensor of a `cfg`-shaped checkpoint with its place in the Flax tree."""
    return list(_param_table(cfg))


@functools.lru_cache(maxsize=32)
def _param_table(cfg: ModelConfig) -> tuple[HFTensor, ...]:
    # Cached per (frozen, hashable) config: param_shapes traces the whole model, which costs
    # more than a small model's whole push and would otherwise run on every push.
    shapes = param_shapes(cfg)
    flags = {
        "qkv_bias": cfg.qkv_bias,
        "qk_norm": cfg.qk_norm,
        "untied": not cfg.tie_word_embeddings,
    }
    table = []
    for hf_name, path, kind, only_if in _TOP_ENTRIES:
        if only_if is None or flags[only_if]:
            table.append(HFTensor(hf_name, path, None, kind, _leaf(shapes, path).shape))
    for i in range(cfg.num_layers):
        for name, sub, kind, only_if in _LAYER_ENTRIES:
            if only_if is not None and not flags[only_if]:
                continue
            hf_name = f"model.layers.{i}.{name}"
            if cfg.scan_layers:
                path = ("layers", *sub)
                table.append(HFTensor(hf_name, path, i, kind, _leaf(shapes, path).shape[1:]))
            else:
                path = (f"layers_{i}", *sub)
                table.append(HFTensor(hf_name, path, None, kind, _leaf(shapes, path).shape))
    return tuple(table)


def _leaf(tree: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _set_leaf(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


# ----------------------------------------------------------------------------- export


# Export: gather each parameter (or chunk of layers of a stacked one) to the host once and
# write it in HF layout straight into its place in the destination (the mmapped safetensors
# file, or a fresh array). The transposes happen where they are cheap: on an accelerator inside
# one fused jitted op (slice + cast + transpose), so the host receives contiguous bytes; on CPU
# as a cache-blocked host copy (XLA's and NumPy's plain strided transposes run at ~5 % of memcpy
# speed there, 64-row blocks at ~60 %). The cast comes first, on device, so a bfloat16 push
# moves half the bytes. The first version (per-layer device slices one small op at a time,
# then a NumPy transpose of a strided view, then a second copy into the file) ran at ~2 % of
# memcpy speed.
_CHUNK_BYTES = 256 << 20  # the most one chunk of a stacked parameter holds, on device and host
_BLOCK_ROWS = 64  # source rows per blocked-transpose step: keeps the working set in L2


@dataclasses.dataclass(frozen=True)
class _Group:
    """The HF tensors cut from one Flax parameter (every layer of a stacked one), in file order."""

    path: tuple[str, ...]
    kind: str
    entries: tuple[HFTensor, ...]
    stacked: bool


@functools.lru_cache(maxsize=32)
def _groups(cfg: ModelConfig) -> tuple[_Group, ...]:
    by_path: dict[tuple[str, ...], list[HFTensor]] = {}
    for e in _param_table(cfg):
        by_path.setdefault(e.path, []).append(e)
    groups = []
    for path, entries in by_path.items():
        stacked = entries[0].layer is not None
        if stacked:
            entries = sorted(entries, key=lambda e: e.layer)
            assert [e.layer for e in entries] == list(range(len(entries))), path
        groups.append(_Group(path, entries[0].kind, tuple(entries), stacked))
    return tuple(groups)


def export_order(cfg: ModelConfig) -> list[HFTensor]:
    """The table in the order export writes it: parameter by parameter, layers consecutive."""
    return [e for g in _groups(cfg) for e in g.entries]


def _as_matrix(p, kind: str, lead: int):
    """Our layout of a (lead-batched) parameter as [..., A, B] whose HF layout is [..., B, A]."""
    batch, s = p.shape[:lead], p.shape[lead:]
    if kind == "heads_in":  # [D, H, E] -> HF [H*E, D]
        return p.reshape(*batch, s[0], -1)
    if kind == "heads_out":  # [H, E, D] -> HF [D, H*E]
        return p.reshape(*batch, -1, s[-1])
    return p  # linear [in, out] -> HF [out, in]


def _hf_layout(p: jax.Array, kind: str, lead: int) -> jax.Array:
    """HFTensor.to_hf on device, over `lead` leading (layer) axes."""
    if kind in ("linear", "heads_in", "heads_out"):
        return jnp.swapaxes(_as_matrix(p, kind, lead), -1, -2)
    return p


@functools.partial(jax.jit, static_argnames=("kind", "dtype", "chunk", "layout"))
def _device_chunk(x: jax.Array, start, *, kind: str, dtype: str, chunk: int, layout: bool):
    """Layers [start, start + chunk) of stacked `x` (chunk=0: all of unstacked `x`, with a new
    leading axis), cast to `dtype`, in HF layout if `layout`."""
    if chunk:
        x = jax.lax.dynamic_slice_in_dim(x, start, chunk, axis=0)
    else:
        x = x[None]
    x = x.astype(dtype)
    return _hf_layout(x, kind, lead=1) if layout else x


def _chunk_layers(layers: int, layer_bytes: int) -> int:
    """The largest divisor of `layers` whose chunk fits _CHUNK_BYTES (one compile per shape)."""
    fits = [c for c in range(1, layers + 1) if layers % c == 0 and c * layer_bytes <= _CHUNK_BYTES]
    return max(fits, default=1)


def _host_chunks(params: Any, cfg: ModelConfig, dtype: str | None, on_device: bool | None):
    """(group, entries, host array [n, ...], HF layout already?) for every chunk, in file order."""
    for g in _groups(cfg):
        leaf = _leaf(params, g.path)
        target = str(jnp.dtype(dtype or leaf.dtype))
        same = jnp.dtype(leaf.dtype) == jnp.dtype(target)
        # Transpose on the accelerator, or on the host when the devices are the CPU.
        device = jax.default_backend() != "cpu" if on_device is None else on_device
        needs_layout = g.kind in ("linear", "heads_in", "heads_out")
        if same and not (device and needs_layout):
            host = _to_host(leaf)  # no device op at all (zero-copy on a single CPU device)
            yield g, g.entries, (host if g.stacked else host[None]), not needs_layout
            continue
        n = len(g.entries)
        chunk = _chunk_layers(n, int(np.prod(leaf.shape[1:])) * jnp.dtype(target).itemsize)
        for start in range(0, n, chunk) if g.stacked else [0]:
            out = _device_chunk(
                leaf,
                start,
                kind=g.kind,
                dtype=target,
                chunk=chunk if g.stacked else 0,
                layout=device,
            )
            yield g, g.entries[start : start + len(out)], _to_host(out), device or not needs_layout


def _fill_hf(dst: np.ndarray, host: np.ndarray, kind: str, in_layout: bool) -> None:
    """dst [n, *hf_shape] <- host [n, ...our layout]: a copy, or a cache-blocked transpose."""
    if in_layout:
        np.copyto(dst, host.reshape(dst.shape), casting="no")
        return
    src = _as_matrix(host, kind, lead=1)  # [n, A, B]; dst is [n, B, A]
    for layer in range(src.shape[0]):
        for i in range(0, src.shape[1], _BLOCK_ROWS):
            dst[layer, :, i : i + _BLOCK_ROWS] = src[layer, i : i + _BLOCK_ROWS].T


def iter_hf_chunks(
    params: Any, cfg: ModelConfig, *, dtype: str | None = None, on_device: bool | None = None
) -> Iterator[tuple[tuple[HFTensor, ...], np.ndarray]]:
    """(entries, fresh host array [len(entries), *hf_shape]) in `export_order`.

    `dtype` ("float32"/"bfloat16"/"float16"/None = keep) is applied on device before the
    transfer. `on_device`: do the transposes on the device (default: unless it is the CPU).
    """
    for g, entries, host, in_layout in _host_chunks(params, cfg, dtype, on_device):
        dst = np.empty((len(entries), *entries[0].hf_shape), host.dtype)
        _fill_hf(dst, host, g.kind, in_layout)
        yield entries, dst


def iter_hf_tensors(
    params: Any, cfg: ModelConfig, *, dtype: str | None = None
) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, host array) in HF layout, in `export_order`; tied models have no lm_head.

    `dtype` ("float32"/"bfloat16"/None = keep) casts on device before the transfer.
    """
    for entries, host in iter_hf_chunks(params, cfg, dtype=dtype):
        for e, arr in zip(entries, host, strict=True):
            yield e.hf_name, arr


def to_hf_tensors(
    params: Any, cfg: ModelConfig, *, dtype: str | None = None
) -> dict[str, np.ndarray]:
    """All HF-named tensors as host NumPy arrays, exactly HF names and shapes."""
    return dict(iter_hf_tensors(params, cfg, dtype=dtype))


def _to_host(x: Any) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def safetensors_header(
    cfg: ModelConfig, dtype: str, metadata: Mapping[str, str] | None = None
) -> tuple[bytes, int]:
    """(length-prefixed, 8-byte aligned header, data bytes) of the export of `cfg` in `dtype`."""
    if dtype not in _ST_DTYPES:
        raise ValueError(
            f"safetensors export dtype must be one of {sorted(_ST_DTYPES)}, got {dtype!r}"
        )
    itemsize = jnp.dtype(dtype).itemsize
    header: dict[str, Any] = {}
    offset = 0
    for e in export_order(cfg):
        nbytes = int(np.prod(e.hf_shape)) * itemsize
        header[e.hf_name] = {
            "dtype": _ST_DTYPES[dtype],
            "shape": list(e.hf_shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    if metadata:
        header["__metadata__"] = dict(metadata)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # safetensors aligns the data section to 8 bytes
    return struct.pack("<Q", len(blob)) + blob, offset


def write_hf_safetensors(
    file: str | Path | None,
    params: Any,
    cfg: ModelConfig,
    dtype: str,
    metadata: Mapping[str, str] | None = None,
    *,
    on_device: bool | None = None,
) -> int:
    """Write `params` as one HF safetensors file; returns its size in bytes.

    Every process of a multi-process run must call this (gathering is collective); pass
    file=None on the processes that do not write. A chunk already in HF layout is written from
    its host buffer; one that still needs its transpose is transposed into a reused scratch
    buffer first. No serialisation buffer exists. `on_device` as in `iter_hf_chunks`.
    """
    head, nbytes = safetensors_header(cfg, dtype, metadata)
    chunks = _host_chunks(params, cfg, dtype, on_device)
    if file is None:
        for _ in chunks:  # still take part in any cross-process gathers
            pass
        return len(head) + nbytes
    np_dtype = np.dtype(jnp.dtype(dtype))
    scratch = np.empty(0, np.uint8)  # reused: its pages stay mapped across chunks
    offset = 0
    with open(file, "wb") as f:
        f.write(head)
        for g, entries, host, in_layout in chunks:
            shape = (len(entries), *entries[0].hf_shape)
            if host.dtype != np_dtype or host.shape[0] != shape[0]:
                raise ValueError(
                    f"export of {entries[0].hf_name}: got {host.dtype}{list(host.shape)}, "
                    f"expected {dtype}{list(shape)}"
                )
            if in_layout:
                out = np.ascontiguousarray(host).reshape(shape)
            else:
                size = int(np.prod(shape)) * np_dtype.itemsize
                if scratch.nbytes < size:
                    scratch = np.empty(size, np.uint8)
                out = scratch[:size].view(np_dtype).reshape(shape)
                _fill_hf(out, host, g.kind, in_layout)
            # write() into tmpfs beats filling an mmap of the fresh file (no page faults).
            offset += f.write(out.reshape(-1).view(np.uint8))
    if offset != nbytes:
        raise RuntimeError(f"{file}: wrote {offset} data bytes, the header promises {nbytes}")
    return len(head) + nbytes


def save_hf_checkpoint(
    params: Any,
    cfg: ModelConfig,
    path: str | Path,
    *,
    tokenizer: Any = None,
    dtype: str = "float32",
) -> Path:
    """Write config.json + model.safetensors (+ tokenizer files) that transformers loads.

    In a multi-process run every process must call this (gathering is collective); only
    process 0 writes.
    """
    if dtype not in _ST_DTYPES:
        raise ValueError(
            f"save_hf_checkpoint dtype must be one of {sorted(_ST_DTYPES)}, got {dtype!r}"
        )
    path = Path(path)
    write = jax.process_index() == 0
    if write:
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(cfg.to_hf_config(dtype=dtype), indent=2))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(path))
    file = path / "model.safetensors" if write else None
    write_hf_safetensors(file, params, cfg, dtype, metadata={"format": "pt"})
    return path


# ----------------------------------------------------------------------------- import


def _open_safetensors(file: Path):
    try:
        return safe_open(str(file), "np")
    except (SafetensorError, OSError) as exc:
        raise DataError(f"{file}: not a readable safetensors file ({exc})") from None


class _TensorSource:
    """Tensor name → file for a single or index-sharded safetensors checkpoint."""

    def __init__(self, path: Path):
        index = path / "model.safetensors.index.json"
        if index.exists():
            weight_map = read_json_object(index, DataError).get("weight_map")
            if not isinstance(weight_map, dict) or not all(
                isinstance(f, str) for f in weight_map.values()
            ):
                raise DataError(f"{index}: needs a 'weight_map' object of tensor name -> file name")
            self.files = {name: path / fname for name, fname in weight_map.items()}
        else:
            files = sorted(path.glob("*.safetensors"))
            if not files:
                raise MissingFileError(f"{path}: no *.safetensors files")
            self.files = {}
            for file in files:
                with _open_safetensors(file) as f:
                    self.files.update({name: file for name in f.keys()})
        self._handles: dict[Path, Any] = {}
        self.path = path

    def _handle(self, name: str):
        file = self.files[name]
        if file not in self._handles:
            if not file.exists():
                raise MissingFileError(f"{self.path}: {file.name} (holding {name}) is missing")
            self._handles[file] = _open_safetensors(file)
        return self._handles[file]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(name).get_slice(name).get_shape())

    def get(self, name: str) -> np.ndarray:
        try:
            return self._handle(name).get_tensor(name)
        except SafetensorError as exc:
            raise DataError(f"{self.files[name]}: cannot read tensor {name!r} ({exc})") from None


def _check_tensors(src: _TensorSource, table: list[HFTensor]) -> None:
    for e in table:
        if e.hf_name not in src.files:
            raise DataError(f"{src.path}: checkpoint is missing tensor {e.hf_name!r}")
        got = src.shape(e.hf_name)
        if got != e.hf_shape:
            raise DataError(
                f"{src.files[e.hf_name]}: tensor {e.hf_name!r} has shape {got}, expected "
                f"{e.hf_shape} for this config"
            )


def read_hf_config(path: str | Path) -> dict[str, Any]:
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise MissingFileError(f"{path}: no config.json (not a Hugging Face model directory)")
    return read_json_object(config_file)


def model_config_from_hf(path: str | Path, **overrides: Any) -> ModelConfig:
    """The ModelConfig a HF model directory's config.json describes (ConfigError naming it)."""
    hf_cfg = read_hf_config(path)
    try:
        return ModelConfig.from_hf_config(hf_cfg, **overrides)
    except KeyError as exc:
        raise ConfigError(f"{Path(path) / 'config.json'}: missing {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{Path(path) / 'config.json'}: {exc}") from None


def load_hf_checkpoint(
    path: str | Path,
    *,
    cfg: ModelConfig | None = None,
    shardings: Any = None,
    dtype: str | None = None,
) -> tuple[ModelConfig, Any]:
    """Read a local HF directory into (ModelConfig, params).

    `cfg` overrides the config read from config.json (e.g. scan_layers, dtype; its shapes must
    match the tensors). `shardings`: a pytree of NamedSharding shaped like the params; each
    parameter is then created already sharded. `dtype`: the parameter dtype (default
    cfg.param_dtype).
    """
    path = Path(path)
    if cfg is None:
        cfg = model_config_from_hf(path)
    else:
        model_type = read_hf_config(path).get("model_type")
        if model_type != cfg.family:
            raise ConfigError(
                f"{path / 'config.json'}: model_type {model_type!r} != model.family {cfg.family!r}"
            )
    target = jnp.dtype(dtype or cfg.param_dtype)
    src = _TensorSource(path)
    table = hf_param_table(cfg)
    _check_tensors(src, table)
    return cfg, _assemble(lambda e: src.get(e.hf_name), cfg, table, shardings, target)


def from_hf_tensors(
    tensors: Mapping[str, np.ndarray], cfg: ModelConfig, *, dtype: str | None = None
) -> Any:
    """Params from an in-memory {HF name: array} dict (e.g. a torch state_dict as NumPy)."""
    table = hf_param_table(cfg)
    for e in table:
        if e.hf_name not in tensors:
            raise ValueError(f"missing tensor {e.hf_name!r}")
        if tuple(tensors[e.hf_name].shape) != e.hf_shape:
            raise ValueError(
                f"tensor {e.hf_name!r} has shape {tuple(tensors[e.hf_name].shape)}, expected {e.hf_shape}"
            )
    target = jnp.dtype(dtype or cfg.param_dtype)
    return _assemble(lambda e: np.asarray(tensors[e.hf_name]), cfg, table, None, target)


def _assemble(read, cfg: ModelConfig, table: list[HFTensor], shardings: Any, target) -> Any:
    """Build each parameter from its HF tensor(s) on the host, then place it on devices."""
    by_path: dict[tuple[str, ...], list[HFTensor]] = {}
    for e in table:
        by_path.setdefault(e.path, []).append(e)
    shapes = param_shapes(cfg)
    params: dict = {}
    for path, entries in by_path.items():
        full_shape = _leaf(shapes, path).shape
        host = None
        for e in entries:
            piece = e.to_flax(read(e))
            if e.layer is None:
                host = piece
            else:
                if host is None:
                    host = np.empty(full_shape, piece.dtype)
                host[e.layer] = piece
        _set_leaf(
            params,
            path,
            _place(host, target, None if shardings is None else _leaf(shardings, path)),
        )
    return params


def _place(host: np.ndarray, target, sharding) -> jax.Array:
    if sharding is None:
        return jnp.asarray(host.astype(target, copy=False))
    # Each device's shard is cut from the host array and converted on its own.
    return jax.make_array_from_callback(
        host.shape, sharding, lambda idx: host[idx].astype(target, copy=False)
    )
