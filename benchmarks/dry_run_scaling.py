"""Dry-run memory grid for the scaling notes (docs/scaling.md): Qwen2.5-Math-7B and Qwen3-14B.

Compiles the real train step (forward, DynaMO loss, backward, AdamW update) for each row on
simulated CPU devices, one subprocess per row (`dynamo_jax.sharding.planner.run_dry_run`), and
prints a markdown table of per-device memory. Nothing is allocated; each row takes ~1-2 min on a
2-core machine. Named peer: the same 7B shape with remat off, to show what remat buys
(printed as the ratio of temporaries, remat=none / remat=full).

    python benchmarks/dry_run_scaling.py            # the whole grid (13 rows)
    python benchmarks/dry_run_scaling.py --only 7b  # just the 7B rows
"""

from __future__ import annotations

import argparse
import json
import time

from dynamo_jax.losses import LossConfig
from dynamo_jax.models.presets import get_preset
from dynamo_jax.sharding.mesh import MeshConfig
from dynamo_jax.sharding.planner import GIB, run_dry_run

# (preset, devices, mesh shape, global batch, seq len, micro-batches, remat policy)
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


def run_row(row, device_memory_gb: float) -> dict:
    name, devices, shape, batch, seq, micro, remat = row
    cfg = get_preset(name, dtype="bfloat16", param_dtype="float32", remat_policy=remat)
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
    name, devices, shape, batch, seq, micro, remat = row
    per = report["per_device_bytes"]
    g = lambda k: f"{per[k] / GIB:.1f}"
    fits = "yes" if report["fits"] else "no"
    return (
        f"| {name} | {devices} | {shape} | {batch} x {seq} | {micro} | {remat} | {g('params')} | "
        f"{g('opt_state')} | {g('temporaries')} | {g('peak')} | {fits} | "
        f"{report['compile_seconds']:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("7b", "14b"), default=None)
    parser.add_argument("--device_memory_gb", type=float, default=80.0)
    parser.add_argument("--jsonl", default=None, help="also append each report to this file")
    args = parser.parse_args()
    rows = [r for r in GRID if args.only is None or r[0].endswith(args.only)]
    print(
        "| model | devices | mesh (data, fsdp, tensor) | batch x seq | micro | remat | params GiB "
        "| opt GiB | temp GiB | peak GiB | fits | compile s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
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
