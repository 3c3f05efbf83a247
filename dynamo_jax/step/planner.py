"""Dry-run memory planner: compile the real train step from abstract shapes, report memory.

`plan(...)` builds the mesh on the devices this process has, lowers and compiles the very
`train_step` the trainer runs (forward, DynaMO loss, backward, optax update) from
`jax.ShapeDtypeStruct`s carrying the state/batch shardings, so no parameter is ever allocated,
and reads the per-device sizes from the compiled executable:

- params / optimizer state / batch: exact, from each leaf's shard shape and dtype;
- temporaries: `compiled.memory_analysis().temp_size_in_bytes` (activations kept for the
  backward pass, gathered FSDP shards, gradients, the vocabulary blocks);
- peak: arguments + outputs − donated aliases + temporaries, compared with the device memory.

`run_dry_run(...)` does the same in a fresh subprocess whose XLA_FLAGS simulate the mesh's device
count on CPU, which is what `launch.py --dry_run` calls (the parent's JAX may already be
initialised with another device count). `python -m dynamo_jax.step.planner REQUEST.pkl
REPORT.json` is that subprocess's entry point.

Batches are rows of `seq_len` token slots in `micro_batches` micro-batches (step/forward.py). A
packed run (train.packing, data/packing.py) feeds rows of train.pack_len tokens holding several
sequences each, micro-batches of a token budget's rows, and a varying micro-batch count;
`row_batch_shape` gives the shape the planner compiles for it: the layout's worst case, every
sequence alone in a row (`RowLayout.max_micro_batches`). Memory is the micro-batch's (the step
scans over micro-batches), so a packed mini-batch, which needs fewer micro-batches, fits too.

Attention: `attention_estimate_bytes(...)` is an analytic estimate of the attention temporaries
live at once (the recomputed layer's attention backward under remat) for the model's
`attention_impl`, reported beside the compiled total; compiling the same shape with "matmul" and
with "blockwise" measures the difference (benchmarks/dry_run_scaling.py --grid papers).

Caveat, stated in every report: the program is compiled for the CPU backend. Layouts, fusion and
the scheduler differ on GPU/TPU, so temporaries are an estimate (typically within tens of
percent); parameter, optimizer-state and batch bytes are exact.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from dynamo_jax.models.config import ModelConfig
from dynamo_jax.sharding.mesh import MeshConfig, build_mesh
from dynamo_jax.step.forward import PROMPT_FIELDS, SCALAR_FIELDS
from dynamo_jax.step.state import abstract_train_state
from dynamo_jax.step.train_step import make_train_step

GIB = 1024**3
CAVEAT = "CPU-compiled estimate: temporaries may differ on GPU/TPU; state bytes are exact"


def default_optimizer() -> optax.GradientTransformation:
    """AdamW as in the DynaMO/E3 recipes (lr 1e-6, weight decay 0.01, grad clip 1.0)."""
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6, weight_decay=0.01))


def _sharded_bytes(abstract: Any, shardings: Any) -> int:
    """Bytes one device holds for a tree of ShapeDtypeStructs under matching shardings."""
    leaves = jax.tree.leaves(abstract)
    shard_leaves = jax.tree.leaves(
        shardings, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding)
    )
    total = 0
    for x, s in zip(leaves, shard_leaves, strict=True):
        total += math.prod(s.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
    return total


def _with_shardings(abstract: Any, shardings: Any) -> Any:
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
    )


def row_batch_shape(layout: Any) -> dict[str, int]:
    """`plan`'s batch arguments for a `data.packing.RowLayout`: its worst-case batch."""
    return dict(
        batch_size=layout.max_rows,
        seq_len=layout.row_len,
        micro_batches=layout.max_micro_batches,
        shared_prompts=layout.shared_prompts,
    )


def abstract_batch(
    batch_shardings: dict[str, Any], batch_size: int, seq_len: int
) -> dict[str, jax.ShapeDtypeStruct]:
    """ShapeDtypeStructs for a train batch (forward.py's convention) with its shardings."""
    ints = ("tokens", "positions", "segment_ids", "sequence_index") + PROMPT_FIELDS
    dtypes = dict.fromkeys(ints, jnp.int32)
    out = {}
    for field, sharding in batch_shardings.items():
        shape = (batch_size, seq_len)
        if field in SCALAR_FIELDS:
            shape = ()
        elif field in PROMPT_FIELDS:  # one int per row
            shape = (batch_size,)
        out[field] = jax.ShapeDtypeStruct(shape, dtypes.get(field, jnp.float32), sharding=sharding)
    return out


def plan(
    model_cfg: ModelConfig,
    loss_cfg: Any,
    mesh_cfg: MeshConfig,
    *,
    batch_size: int,
    seq_len: int,
    micro_batches: int = 1,
    device_memory_gb: float = 80.0,
    optimizer_factory: Callable[[], optax.GradientTransformation] = default_optimizer,
    shared_prompts: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Compile the train step for this process's devices and return the memory report.
    `shared_prompts`: `RowLayout.shared_prompts` (train.share_prompts), None for unshared rows."""
    t0 = time.perf_counter()
    mesh = build_mesh(mesh_cfg)
    optimizer = optimizer_factory()
    train_step, state_shardings, batch_shardings = make_train_step(
        model_cfg,
        loss_cfg,
        optimizer,
        mesh,
        mesh_cfg.rules,
        batch_size=batch_size,
        micro_batches=micro_batches,
        shared_prompts=shared_prompts,
    )
    state = abstract_train_state(model_cfg, optimizer)
    batch = abstract_batch(batch_shardings, batch_size, seq_len)
    lowered = train_step.lower(_with_shardings(state, state_shardings), batch)
    compiled = lowered.compile()
    mem = compiled.memory_analysis()
    compile_s = time.perf_counter() - t0

    params_b = _sharded_bytes(state.params, state_shardings.params)
    opt_b = _sharded_bytes(state.opt_state, state_shardings.opt_state)
    batch_b = _sharded_bytes(batch, batch_shardings)
    temp_b = int(mem.temp_size_in_bytes)
    peak_b = int(
        mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes + temp_b
    )
    rows_per_device = _sharded_rows(batch_shardings, batch_size // micro_batches)
    return {
        "model": _model_summary(model_cfg),
        "mesh": dict(mesh.shape),
        "num_devices": mesh.size,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "micro_batches": micro_batches,
        "tokens_per_device_micro_batch": rows_per_device * seq_len,
        "attention_estimate_bytes": attention_estimate_bytes(model_cfg, rows_per_device, seq_len),
        "num_params": int(sum(math.prod(x.shape) for x in jax.tree.leaves(state.params))),
        "per_device_bytes": {
            "params": params_b,
            "opt_state": opt_b,
            "batch": batch_b,
            "temporaries": temp_b,
            "peak": peak_b,
        },
        "xla_memory_analysis": {
            "argument": int(mem.argument_size_in_bytes),
            "output": int(mem.output_size_in_bytes),
            "alias": int(mem.alias_size_in_bytes),
            "temp": temp_b,
        },
        "device_memory_gb": device_memory_gb,
        "fits": peak_b <= device_memory_gb * GIB,
        "compile_seconds": round(compile_s, 1),
        "backend": jax.default_backend(),
        "caveat": CAVEAT,
    }


def attention_estimate_bytes(cfg: ModelConfig, rows: int, seq_len: int) -> int:
    """Attention temporaries of one layer's backward for `rows` rows of `seq_len` tokens on one
    device (before fusion; an estimate, not a measurement).

    "matmul" / "xla" / "cudnn"-on-CPU hold the bool [R, L, L] mask, float32 scores and their
    gradient, and the probabilities and their gradient in the compute dtype: R·H·L²·(4 + 4 +
    2·dtype) + R·L². "blockwise" holds one tile's scores, probabilities, dP and dS (float32,
    R·H·block_q·block_k·16) plus linear terms: float32 dK/dV accumulators (R·L·K·E·8), the
    stacked float32 dQ blocks (R·L·H·E·4) and the log-sum-exp (R·L·H·4). "pallas" (fused, on
    chip tiles) counts only the repeated K/V and their gradients (R·L·H·E·dtype·4).
    """
    h, kh, e, n = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, seq_len
    item = 2 if cfg.dtype == "bfloat16" else 4
    if cfg.attention_impl == "blockwise":
        bq, bk = min(cfg.attention_block_q, n), min(cfg.attention_block_k, n)
        tile = rows * h * bq * bk * 16
        return tile + rows * n * (kh * e * 8 + h * e * 4 + h * 4)
    if cfg.attention_impl == "pallas":
        return rows * n * h * e * item * 4
    return rows * h * n * n * (8 + 2 * item) + rows * n * n


def _sharded_rows(batch_shardings: dict[str, Any], rows: int) -> int:
    """Rows of a `rows`-row batch that one device holds."""
    return batch_shardings["tokens"].shard_shape((rows,))[0]


def _model_summary(cfg: ModelConfig) -> dict[str, Any]:
    keys = ("family", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "vocab_size")
    summary = {k: getattr(cfg, k) for k in keys}
    summary.update(
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        remat_policy=cfg.remat_policy,
        attention_impl=cfg.attention_impl,
    )
    return summary


def run_dry_run(
    model_cfg: ModelConfig,
    loss_cfg: Any,
    mesh_cfg: MeshConfig,
    *,
    num_devices: int,
    batch_size: int,
    seq_len: int,
    micro_batches: int = 1,
    device_memory_gb: float = 80.0,
    optimizer_factory: Callable[[], optax.GradientTransformation] = default_optimizer,
    timeout_s: float = 1800.0,
    shared_prompts: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """`plan(...)` in a subprocess with `num_devices` simulated CPU devices; returns the report.

    Fails before spawning anything if the mesh cannot use `num_devices`. `optimizer_factory`
    must be picklable (a module-level function or a functools.partial of one).
    """
    mesh_cfg.resolved_shape(num_devices)  # clear error now, not in the child
    kwargs = dict(
        batch_size=batch_size,
        seq_len=seq_len,
        micro_batches=micro_batches,
        device_memory_gb=device_memory_gb,
        optimizer_factory=optimizer_factory,
        shared_prompts=shared_prompts,
    )
    with tempfile.TemporaryDirectory() as tmp:
        request, report = os.path.join(tmp, "request.pkl"), os.path.join(tmp, "report.json")
        with open(request, "wb") as f:
            pickle.dump((model_cfg, loss_cfg, mesh_cfg, kwargs), f)
        env = dict(os.environ)
        env["XLA_FLAGS"] = (
            env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={num_devices}"
        ).strip()
        env["JAX_PLATFORMS"] = "cpu"
        cmd = [sys.executable, "-m", "dynamo_jax.step.planner", request, report]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"dry run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        with open(report) as f:
            return json.load(f)


def format_report(report: dict[str, Any]) -> str:
    """Human-readable lines for a `plan` / `run_dry_run` report."""
    per = report["per_device_bytes"]
    gib = lambda b: f"{b / GIB:8.2f} GiB" if b >= GIB / 10 else f"{b / 1024**2:8.2f} MiB"
    m = report["model"]
    lines = [
        f"model: {m['family']} {m['num_layers']}L d={m['hidden_size']} heads={m['num_heads']}/"
        f"{m['num_kv_heads']} V={m['vocab_size']} ({m['param_dtype']} params, {m['dtype']} "
        f"compute, remat={m['remat_policy']}, attention={m.get('attention_impl', 'matmul')})",
        f"parameters: {report['num_params']:,}",
        f"mesh: {report['mesh']} ({report['num_devices']} devices)",
        f"batch: {report['batch_size']} rows x {report['seq_len']} tokens, "
        f"{report['micro_batches']} micro-batch(es) of "
        f"{report['tokens_per_device_micro_batch']:,} tokens per device",
        "per-device memory:",
        f"  params       {gib(per['params'])}",
        f"  opt state    {gib(per['opt_state'])}",
        f"  batch        {gib(per['batch'])}",
        f"  temporaries  {gib(per['temporaries'])}  (attention, estimated: "
        f"{gib(report.get('attention_estimate_bytes', 0)).strip()})",
        f"  peak         {gib(per['peak'])}",
        f"fits a {report['device_memory_gb']:g} GiB device: {'YES' if report['fits'] else 'NO'}",
        f"compiled in {report['compile_seconds']} s on {report['backend']} ({report['caveat']})",
    ]
    return "\n".join(lines)


def _main(argv: list[str]) -> int:
    request, report_path = argv
    with open(request, "rb") as f:
        model_cfg, loss_cfg, mesh_cfg, kwargs = pickle.load(f)
    report = plan(model_cfg, loss_cfg, mesh_cfg, **kwargs)
    with open(report_path, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
