"""Dry-run memory grid for the scaling notes (docs/scaling.md): Qwen2.5-Math-7B and Qwen3-14B.

Compiles the real train step (forward, DynaMO loss, backward, AdamW update) for each row on
simulated CPU devices, one subprocess per row (`dynamo_jax.step.planner.run_dry_run`), and
prints a markdown table of per-device memory. Nothing is allocated; each row takes ~1-2 min on a
2-core machine. Named peer: the same 7B shape with remat off, to show what remat buys
(printed as the ratio of temporaries, remat=none / remat=full).

    python -m benchmarks.dry_run_scaling            # the whole grid (13 rows)
    python -m benchmarks.dry_run_scaling --only 7b  # just the 7B rows
    python -m benchmarks.dry_run_scaling --grid papers  # the papers' lengths, matmul vs blockwise

`--grid papers`: the papers' sequence lengths (DynaMO 14B: 2,048 + 8,192 = 10,240; E3 7B: rows
of 8,192) at 7B fsdp=8 and 14B fsdp=16, one and four 10,240-token rows per device and packed
micro-batches of 16k (2 x 8,192) and 32k (4 x 8,192) tokens per device, each with today's
attention ("matmul", dense [B, L, S] mask and [B, H, L, S] scores) and "blockwise" (linear in
length) beside it, plus the planner's analytic attention estimate for each.
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks.harness import header
from dynamo_jax.losses import LossConfig
from dynamo_jax.models.presets import get_preset
from dynamo_jax.sharding.mesh import MeshConfig
from dynamo_jax.step.planner import GIB, run_dry_run

# (preset, devices, mesh shape, global batch, seq len, micro-batches, remat policy[, attention])
GRID = [
    ("qwen2.5-math-7b", 8, (1, 8, 1), 8, 2048, 1, "full"),
    ("qwen2.5-math-7b", 8, (1, 8, 1), 8, 4096, 1, "full"),
    ("qwen2.5-math-7b", 8, (1, 8, 1), 16, 4096, 1, "full"),
    ("qwen2.5-math-7b", 8, (1, 8, 1), 48, 4096, 1, "full"),
    ("qwen2.5-math-7b", 8, (1, 8, 1), 8, 8192, 1, "full"),
    ("qwen2.5-math-7b", 8, (1, 8, 1), 64, 4096, 8, "full"),
    ("qwen2.5-math-7b", 8, (1, 4, 2), 8, 4096, 1, "full"),
    ("qwen2.5-math-7b", 8, (1, 8, 1), 8, 2048, 1, "none"),
    ("qwen3-14b", 16, (1, 16, 1), 16, 2048, 1, "full"),
    ("qwen3-14b", 16, (1, 16, 1), 16, 4096, 1, "full"),
    ("qwen3-14b", 16, (1, 16, 1), 32, 4096, 1, "full"),
    ("qwen3-14b", 16, (1, 16, 1), 16, 8192, 1, "full"),
    ("qwen3-14b", 16, (1, 8, 2), 16, 4096, 1, "full"),
]

# Rows per device x tokens: 1 x 10,240, 4 x 10,240, 2 x 8,192 (16k), 4 x 8,192 (32k).
_PAPER_SHAPES = [(1, 10240), (4, 10240), (2, 8192), (4, 8192)]
PAPER_GRID = [
    (name, devices, shape, rows * devices, seq, 1, "full", impl)
    for name, devices, shape in (
        ("r1-distill-qwen-7b", 8, (1, 8, 1)),
        ("qwen3-14b", 16, (1, 16, 1)),
    )
    for rows, seq in _PAPER_SHAPES
    for impl in ("matmul", "blockwise")
]


def _fields(row):
    return row if len(row) == 8 else (*row, "matmul")


def run_row(row, device_memory_gb: float) -> dict:
    name, devices, shape, batch, seq, micro, remat, impl = _fields(row)
    cfg = get_preset(
        name, dtype="bfloat16", param_dtype="float32", remat_policy=remat, attention_impl=impl
    )
    return run_dry_run(
        cfg,
        LossConfig(),
        MeshConfig(shape=shape),
        num_devices=devices,
        batch_size=batch,
        seq_len=seq,
        micro_batches=micro,
        device_memory_gb=device_memory_gb,
    )


def table_line(row, report: dict) -> str:
    name, devices, shape, batch, seq, micro, remat, impl = _fields(row)
    per = report["per_device_bytes"]
    g = lambda k: f"{per[k] / GIB:.1f}"
    fits = "yes" if report["fits"] else "no"
    attn = report["attention_estimate_bytes"] / GIB
    return (
        f"| {name} | {devices} | {shape} | {batch} x {seq} | {micro} | {remat} | {impl} | "
        f"{g('params')} | {g('opt_state')} | {g('temporaries')} | {attn:.1f} | {g('peak')} | "
        f"{fits} | {report['compile_seconds']:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("7b", "14b"), default=None)
    parser.add_argument("--grid", choices=("scaling", "papers"), default="scaling")
    parser.add_argument("--impl", default=None, help="papers grid: only this attention_impl")
    parser.add_argument("--device_memory_gb", type=float, default=80.0)
    parser.add_argument("--jsonl", default=None, help="also append each report to this file")
    args = parser.parse_args()
    grid = GRID if args.grid == "scaling" else PAPER_GRID
    rows = [r for r in grid if args.only is None or r[0].endswith(args.only)]
    rows = [r for r in rows if args.impl is None or _fields(r)[7] == args.impl]
    print(header(f"dry_run_scaling: grid {args.grid}"))
    print(
        "| model | devices | mesh (data, fsdp, tensor) | batch x seq | micro | remat | attention "
        "| params GiB | opt GiB | temp GiB | attention est. GiB | peak GiB | fits | compile s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    reports = {}
    for row in rows:
        t0 = time.perf_counter()
        report = run_row(row, args.device_memory_gb)
        report["wall_seconds"] = round(time.perf_counter() - t0, 1)
        reports[row] = report
        print(table_line(row, report), flush=True)
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps({"row": list(row), "report": report}) + "\n")
    full, none = GRID[0], GRID[7]
    if full in reports and none in reports:
        t_full = reports[full]["per_device_bytes"]["temporaries"]
        t_none = reports[none]["per_device_bytes"]["temporaries"]
        print(f"\ntemporaries remat=none / remat=full (7B, 8 x 2048): {t_none / t_full:.2f}x")


if __name__ == "__main__":
    main()
