"""PNG plots of a run from its metrics.jsonl: reward, entropy, temperature, allocation over time.

    python -m dynamo_jax.reporting.plots WORKDIR [--out DIR]

Written at the end of a run (into WORKDIR/plots) and on demand from a running or finished
workdir. Uses matplotlib's Agg backend, so it works without a display.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from dynamo_jax.reporting.metrics import read_metrics


def _pyplot():
    """matplotlib's pyplot on the Agg backend, imported when a plot is drawn: a run imports
    this module at its start and draws at its end (the import takes ~0.5 s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# (file name, title, [(metric key, legend label)])
_LINE_PLOTS = (
    ("reward.png", "Mean reward", [("reward/mean", "train"), ("eval/pass@1", "eval pass@1")]),
    ("entropy.png", "Mean token entropy (nats)", [("entropy/mean", "entropy")]),
    ("temperature.png", "Sampling temperature", [("temperature", "T")]),
)


def _series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [
        (r["step"], float(r[key]))
        for r in records
        if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)
    ]
    if not pts:
        return np.zeros(0), np.zeros(0)
    steps, values = zip(*pts)
    return np.asarray(steps), np.asarray(values)


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average (the raw series is drawn too, faintly)."""
    if len(values) < window or window < 2:
        return values
    c = np.cumsum(np.insert(values, 0, 0.0))
    head = c[1:window] / np.arange(1, window)
    return np.concatenate([head, (c[window:] - c[:-window]) / window])


def _line_plot(records, path: Path, title: str, keys) -> bool:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    drawn = False
    for key, label in keys:
        steps, values = _series(records, key)
        if len(steps) == 0:
            continue
        window = max(1, len(values) // 20)
        line = ax.plot(steps, values, alpha=0.3)[0]
        ax.plot(steps, _smooth(values, window), color=line.get_color(), label=label)
        drawn = True
    if drawn:
        ax.set(title=title, xlabel="step")
        ax.legend(loc="best")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn


def _allocation_plot(records, path: Path) -> bool:
    """Top: min/mean/max of n_i per step. Bottom: histogram of n_i per step as a heat map."""
    steps, mean = _series(records, "alloc/n_mean")
    if len(steps) == 0:
        return False
    _, lo = _series(records, "alloc/n_min")
    _, hi = _series(records, "alloc/n_max")
    hists = [
        (r["step"], r["alloc/n_hist"]) for r in records if isinstance(r.get("alloc/n_hist"), list)
    ]
    plt = _pyplot()
    fig, axes = plt.subplots(2 if hists else 1, 1, figsize=(6, 6 if hists else 3.5), squeeze=False)
    ax = axes[0, 0]
    ax.fill_between(steps, lo, hi, alpha=0.3, label="min..max")
    ax.plot(steps, mean, label="mean")
    ax.set(title="Rollouts per prompt n_i", xlabel="step", ylabel="n_i")
    ax.legend(loc="best")
    if hists:
        width = max(len(h) for _, h in hists)
        grid = np.zeros((width, len(hists)))
        for col, (_, h) in enumerate(hists):
            grid[: len(h), col] = h
        hax = axes[1, 0]
        extent = (hists[0][0], hists[-1][0], -0.5, width - 0.5)
        im = hax.imshow(grid, aspect="auto", origin="lower", extent=extent, cmap="viridis")
        hax.set(title="Prompts per n_i value", xlabel="step", ylabel="n_i")
        fig.colorbar(im, ax=hax, label="prompts")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_plots(workdir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write every plot that has data; returns the paths written."""
    records = read_metrics(workdir)
    out = Path(out_dir) if out_dir is not None else Path(workdir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, title, keys in _LINE_PLOTS:
        if _line_plot(records, out / name, title, keys):
            written.append(out / name)
    if _allocation_plot(records, out / "allocation.png"):
        written.append(out / "allocation.png")
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", help="run directory holding metrics.jsonl")
    parser.add_argument("--out", default=None, help="output directory (default WORKDIR/plots)")
    args = parser.parse_args(argv)
    if not (Path(args.workdir) / "metrics.jsonl").exists():
        raise SystemExit(f"{args.workdir}: no metrics.jsonl (is this a run directory?)")
    for path in write_plots(args.workdir, args.out):
        print(path)


if __name__ == "__main__":
    main()
