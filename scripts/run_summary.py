"""A run's step time split, tokens/s and held-out pass@1, from its workdir's metrics.jsonl.

    python scripts/run_summary.py WORKDIR [--out summary.json]

Step 1 holds the compiles, so the split is the mean over the later steps (step 1's own seconds
are reported beside it); `time/*` are the phases the loop times (generate, old_logprobs,
update, weight_push, ...; `time/step` the whole step), `perf/tokens_per_s` the trained response
tokens over the step's time. pass@1 is `eval/pass@1` at the first and the last evaluation.
Per step, the engine-vs-trainer log-prob gap (mean and max |Δ log π| over the trained tokens)
and, with rollout correction, the `rollout_corr/*` metrics.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynamo_jax.reporting.metrics import read_metrics  # noqa: E402

PER_STEP = ("rollout/engine_logp_abs_diff", "rollout/engine_logp_abs_diff_max", "reward/mean")


def summarize(records: list[dict]) -> dict:
    steps = [r for r in records if "time/step" in r]
    if not steps:
        raise ValueError("no step records (metrics.jsonl empty or missing)")
    later = steps[1:] or steps
    mean = lambda key: sum(r.get(key, 0.0) for r in later) / len(later)
    phases = sorted({k for r in steps for k in r if k.startswith("time/")})
    evals = [r for r in records if "eval/pass@1" in r]
    out = {
        "steps": len(steps),
        "first_step_s": steps[0]["time/step"],
        "time_split_s": {k[len("time/") :]: mean(k) for k in phases},
        "tokens_per_s": mean("perf/tokens_per_s"),
        "per_step": [
            {"step": r.get("step"), **{k: r[k] for k in r if k in PER_STEP or "rollout_corr/" in k}}
            for r in steps
        ],
    }
    if evals:
        first, last = evals[0]["eval/pass@1"], evals[-1]["eval/pass@1"]
        out["eval_pass@1"] = {"first": first, "last": last, "rise_points": 100 * (last - first)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    summary = summarize(read_metrics(args.workdir))
    split = ", ".join(f"{k} {v:.2f} s" for k, v in summary["time_split_s"].items())
    print(f"{summary['steps']} steps; step 1 {summary['first_step_s']:.1f} s; later steps: {split}")
    print(f"trained tokens/s {summary['tokens_per_s']:.1f}; pass@1 {summary.get('eval_pass@1')}")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
