"""Held-out evaluation curves of several runs, grouped by method: every seed's numbers and a plot.

    python -m benchmarks.seed_curves grpo=W1,W2,W3 dynamo=W4,W5,W6 --out curves.png
    python -m benchmarks.seed_curves bf16=W1,W2 --keys rollout/engine_logp_abs_diff

Reads each workdir's metrics.jsonl (the `eval/overall/pass@k` and `eval_greedy/overall/pass@1`
lines the in-loop evaluation writes) and prints, per method, one markdown row per seed: the
value at every evaluated step, the rise from step 0 to the last evaluation, the area under the
curve (trapezoids over the evaluated steps, divided by their span: the curve's mean height, in
the metric's own units) and the run's wall time (from the `time/*` fields). `--alloc` adds what
the allocation did in each run (`allocation_table`). The plot has one panel per metric (and one
for the training pool's per-prompt accuracy), a thin line per seed and a thick line for the
seeds' mean. Nothing is averaged away in the tables: every seed is a row.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from dynamo_jax.loop.report import moved_share  # noqa: E402
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


def area_under(curve: dict[int, float]) -> float:
    """Trapezoid area under step → value over the evaluated steps, divided by their span (the
    curve's mean height; a single point is its own value)."""
    xs = sorted(curve)
    if len(xs) < 2:
        return float(curve[xs[0]]) if xs else float("nan")
    return float(np.trapezoid([curve[x] for x in xs], xs) / (xs[-1] - xs[0]))


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


def table(groups: dict[str, list[Path]], key: str, fmt: str = ".3f") -> str:
    """One markdown table for `key`: a row per (method, run), the value at every eval step."""
    curves = {
        (label, d): eval_curve(_records(d), key) for label, dirs in groups.items() for d in dirs
    }
    steps = sorted({s for c in curves.values() for s in c})
    head = (
        "| method | run | " + " | ".join(f"step {s}" for s in steps) + " | rise | AUC | minutes |"
    )
    rows = [head, "|" + "---|" * (len(steps) + 5)]
    for (label, d), curve in curves.items():
        vals = [f"{curve[s]:{fmt}}" if s in curve else "" for s in steps]
        rise = curve[max(curve)] - curve[min(curve)] if curve else float("nan")
        minutes = wall_seconds(_records(d)) / 60
        rows.append(
            f"| {label} | {d.name} | "
            + " | ".join(vals)
            + f" | {rise:+{fmt}} | {area_under(curve):{fmt}} | {minutes:.1f} |"
        )
    return "\n".join(rows)


def _train_lines(records: list[dict]) -> list[dict]:
    return [r for r in records if "reward/prompt_mean" in r]


def _moved_share(line: dict) -> float:
    """The logged `alloc/moved_share`, or (runs from before it was logged) the same formula on
    the step's n_i histogram."""
    if "alloc/moved_share" in line:
        return float(line["alloc/moved_share"])
    counts = np.asarray(line["alloc/n_hist"], np.int64)
    return moved_share(np.repeat(np.arange(counts.size), counts))


def _summed_hist(lines: list[dict]) -> np.ndarray:
    """The steps' `alloc/n_hist` added up (prompts given each n_i)."""
    hists = [np.asarray(r["alloc/n_hist"], np.int64) for r in lines]
    total = np.zeros(max(h.size for h in hists), np.int64)
    for h in hists:
        total[: h.size] += h
    return total


def allocation_table(groups: dict[str, list[Path]]) -> str:
    """What the allocation did, a row per run, over its training steps: the share of the budget
    moved away from uniform (`alloc/moved_share`, mean and max), the share of groups with no
    signal (all correct or all wrong: `reward/zero_var_groups`, mean), the range of n_i, the n_i
    histogram summed over the steps (`n×count`), and the training pool's per-prompt accuracy
    (`reward/prompt_mean`) over the first and the last five steps."""
    head = (
        "| method | run | steps | moved (mean) | moved (max) | no-signal groups | n_i range "
        "| n_i histogram (n×prompts) | pool acc. first 5 | pool acc. last 5 |"
    )
    rows = [head, "|" + "---|" * 10]
    for label, dirs in groups.items():
        for d in dirs:
            lines = _train_lines(_records(d))
            if not lines:
                raise SystemExit(f"seed_curves: {d}/metrics.jsonl: no training steps")
            moved = [_moved_share(r) for r in lines]
            hist = _summed_hist(lines)
            n_lo = min(int(r["alloc/n_min"]) for r in lines if "alloc/n_min" in r)
            n_hi = max(int(r["alloc/n_max"]) for r in lines if "alloc/n_max" in r)
            zero_var = np.mean([r["reward/zero_var_groups"] for r in lines])
            acc = [r["reward/prompt_mean"] for r in lines]
            histogram = " ".join(f"{n}×{c}" for n, c in enumerate(hist.tolist()) if c)
            rows.append(
                f"| {label} | {d.name} | {len(lines)} | {np.mean(moved):.3f} | {max(moved):.3f} "
                f"| {zero_var:.3f} | {n_lo}–{n_hi} | {histogram} "
                f"| {np.mean(acc[:5]):.3f} | {np.mean(acc[-5:]):.3f} |"
            )
    return "\n".join(rows)


def train_curve(records: list[dict], window: int = 5) -> dict[int, float]:
    """Step → the training pool's per-prompt accuracy, averaged over the last `window` steps
    (one step's 8 prompts are too few to read a trend from)."""
    lines = _train_lines(records)
    acc = [float(r["reward/prompt_mean"]) for r in lines]
    return {
        int(r["step"]): float(np.mean(acc[max(0, i + 1 - window) : i + 1]))
        for i, r in enumerate(lines)
    }


PANELS = (*METRICS, ("reward/prompt_mean", "training pool accuracy (5-step mean)"))


def _panel_curve(records: list[dict], key: str) -> dict[int, float]:
    return train_curve(records) if key == "reward/prompt_mean" else eval_curve(records, key)


def plot(groups: dict[str, list[Path]], out: Path) -> None:
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, title) in zip(axes, PANELS):
        for colour, (label, dirs) in zip(colours, groups.items()):
            curves = [_panel_curve(_records(d), key) for d in dirs]
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


def plot_allocation(groups: dict[str, list[Path]], out: Path) -> None:
    """What the allocation did at every step: the budget moved away from uniform and the groups
    with no signal (a thin line per seed), and the n_i histogram over all steps (the share of
    prompts given each n, seeds together)."""
    fig, axes = plt.subplots(1, 3, figsize=(12.6, 3.4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / max(1, len(groups))
    for k, (colour, (label, dirs)) in enumerate(zip(colours, groups.items())):
        runs = [_train_lines(_records(d)) for d in dirs]
        for i, lines in enumerate(runs):
            steps = [int(r["step"]) for r in lines]
            kw = {"color": colour, "alpha": 0.6, "linewidth": 1}
            kw["label"] = label if i == 0 else None
            axes[0].plot(steps, [_moved_share(r) for r in lines], **kw)
            axes[1].plot(steps, [r["reward/zero_var_groups"] for r in lines], **kw)
        hist = _summed_hist([r for lines in runs for r in lines])
        n = np.arange(hist.size)
        axes[2].bar(n + (k - (len(groups) - 1) / 2) * width, hist / hist.sum(), width, color=colour)
    for ax, title in zip(
        axes,
        (
            "budget moved from uniform",
            "groups with no signal (all right or all wrong)",
            "n_i over all steps (share of prompts)",
        ),
    ):
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("step")
    axes[2].set_xlabel("rollouts n_i")
    axes[1].set_ylim(0, 1)
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
    p.add_argument(
        "--keys_format",
        default=".3f",
        help="format of the --keys tables' values, e.g. .1e for the engine's log-prob gap",
    )
    p.add_argument(
        "--alloc",
        action="store_true",
        help="also print what the allocation did in each run (and plot it beside --out)",
    )
    args = p.parse_args(argv)
    groups = parse_groups(args.groups)
    for key, title in METRICS:
        print(f"\n{title} (`{key}`)\n")
        print(table(groups, key))
    for key in args.keys:
        print(f"\n{key} (`{key}`)\n")
        print(table(groups, key, args.keys_format))
    if args.alloc:
        print("\nwhat the allocation did\n")
        print(allocation_table(groups))
        if args.out:
            alloc_out = args.out.with_name(f"{args.out.stem}_alloc{args.out.suffix}")
            plot_allocation(groups, alloc_out)
            print(f"\nallocation plot: {alloc_out}")
    if args.out:
        plot(groups, args.out)
        print(f"\nplot: {args.out}")


if __name__ == "__main__":
    main()
