"""Held-out evaluation curves of several runs, grouped by method: every seed's numbers and a plot.

    python -m benchmarks.seed_curves grpo=W1,W2,W3 dynamo=W4,W5,W6 --out curves.png
    python -m benchmarks.seed_curves bf16=W1,W2 --keys rollout/engine_logp_abs_diff

Reads each workdir's metrics.jsonl (the `eval/overall/pass@k` and `eval_greedy/overall/pass@1`
lines the in-loop evaluation writes) and prints, per method, one markdown row per seed: the
value at every evaluated step, the rise from step 0 to the last evaluation, and the run's wall
time (from the `time/*` fields). The plot has one panel per metric, a thin line per seed and a
thick line for the seeds' mean. Nothing is averaged away in the table: every seed is a row.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from dynamo_jax.reporting.metrics import read_metrics  # noqa: E402

METRICS = (
    ("eval/overall/pass@1", "held-out pass@1 (T = 1)"),
    ("eval/overall/pass@8", "held-out pass@8 (T = 1)"),
    ("eval_greedy/overall/pass@1", "held-out greedy accuracy"),
)


def _records(workdir: Path) -> list[dict]:
    records = read_metrics(workdir)
    if not records:
        raise SystemExit(f"seed_curves: {workdir}/metrics.jsonl: missing or empty")
    return records


def eval_curve(records: list[dict], key: str) -> dict[int, float]:
    """Step → value of `key` on the lines that carry it (the evaluation steps)."""
    return {int(r["step"]): float(r[key]) for r in records if key in r}


def wall_seconds(records: list[dict]) -> float:
    """Seconds the run spent in its steps and evaluations (compilation included, start-up not)."""
    return float(sum(r.get("time/step", 0.0) + r.get("time/eval", 0.0) for r in records))


def parse_groups(specs: list[str]) -> dict[str, list[Path]]:
    groups: dict[str, list[Path]] = {}
    for spec in specs:
        label, sep, dirs = spec.partition("=")
        if not sep or not dirs:
            raise SystemExit(f"seed_curves: expected LABEL=DIR[,DIR...], got {spec!r}")
        groups[label] = [Path(d) for d in dirs.split(",")]
    return groups


def table(groups: dict[str, list[Path]], key: str) -> str:
    """One markdown table for `key`: a row per (method, run), the value at every eval step."""
    curves = {
        (label, d): eval_curve(_records(d), key) for label, dirs in groups.items() for d in dirs
    }
    steps = sorted({s for c in curves.values() for s in c})
    head = "| method | run | " + " | ".join(f"step {s}" for s in steps) + " | rise | minutes |"
    rows = [head, "|" + "---|" * (len(steps) + 4)]
    for (label, d), curve in curves.items():
        vals = [f"{curve[s]:.3f}" if s in curve else "" for s in steps]
        rise = curve[max(curve)] - curve[min(curve)] if curve else float("nan")
        minutes = wall_seconds(_records(d)) / 60
        rows.append(
            f"| {label} | {d.name} | " + " | ".join(vals) + f" | {rise:+.3f} | {minutes:.1f} |"
        )
    return "\n".join(rows)


def plot(groups: dict[str, list[Path]], out: Path) -> None:
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4.2 * len(METRICS), 3.4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, title) in zip(axes, METRICS):
        for colour, (label, dirs) in zip(colours, groups.items()):
            curves = [eval_curve(_records(d), key) for d in dirs]
            for curve in curves:
                xs = sorted(curve)
                ax.plot(xs, [curve[x] for x in xs], color=colour, alpha=0.35, linewidth=1)
            common = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            if common:
                mean = [np.mean([c[x] for c in curves]) for x in common]
                ax.plot(
                    common, mean, color=colour, linewidth=2.5, label=f"{label} ({len(dirs)} seeds)"
                )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("groups", nargs="+", help="LABEL=WORKDIR[,WORKDIR...]")
    p.add_argument("--out", type=Path, default=None, help="write the plot here (PNG)")
    p.add_argument(
        "--keys",
        nargs="*",
        default=[],
        help="more metrics to tabulate at every step that logs them, e.g. "
        "rollout/engine_logp_abs_diff rollout/engine_logp_abs_diff_max",
    )
    args = p.parse_args(argv)
    groups = parse_groups(args.groups)
    for key, title in (*METRICS, *((k, k) for k in args.keys)):
        print(f"\n{title} (`{key}`)\n")
        print(table(groups, key))
    if args.out:
        plot(groups, args.out)
        print(f"\nplot: {args.out}")


if __name__ == "__main__":
    main()
