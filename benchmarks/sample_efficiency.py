"""Sample efficiency on the synthetic task: DynaMO vs GRPO vs E3 at equal rollout budget.

    python -m benchmarks.sample_efficiency [--seeds 5] [--steps 150] [--targets 0.5,0.7,0.9]
    python -m benchmarks.sample_efficiency --methods grpo,dynamo --jobs 2
    python -m benchmarks.sample_efficiency --task mixed --steps 300 --jobs 2 --diagnose
    python -m benchmarks.sample_efficiency --task mixed --warm_start 100 --steps 150 --jobs 2
    python -m benchmarks.sample_efficiency --methods grpo,dynamo,dynamo_posterior_std --jobs 2

Runs configs/tiny.py (its `task`: max, or mixed copy/max/min) once per (method, seed) with the
same prompts per step, the same mean rollouts per prompt (so the same rollout budget
B = N · n_avg per step) and the same number of steps, then prints, per method and target, the
median number of steps until the mean per-prompt accuracy (`reward/prompt_mean`, trailing
5-step average) first reaches the target, and its ratio to GRPO's. A run that never reaches a
target counts as steps + 1 (and is reported as a miss). Besides the issue's three methods it
runs DynaMO's two halves alone (dynamo_no_dra: uniform allocation + GC/UMS loss;
dynamo_no_modulation: water-level allocation + plain surrogate), so a difference can be traced
to the allocation or to the loss, and DynaMO with the allocation its authors' script runs
(dynamo_as_run). `--methods` takes any method of configs/tiny.py, e.g. the allocation options
of docs/algorithm.md#allocation-variants (dynamo_posterior, dynamo_std, dynamo_entropy, dynamo_posterior_std).
Target from the issue: DynaMO <= 0.8x
GRPO steps to 0.9. `grpo_dynamic_sampling` (GRPO + DAPO's dynamic sampling) generates more
rollouts than the budget per step: the last column (rollouts generated per step) is its cost. `--diagnose` also prints, for every run, the problems whose final greedy
answer is wrong (the final policy's first-token distribution per problem). `--warm_start K`
starts every run from the policy GRPO reaches in K steps (one shared run, exported as an HF
directory): the regime of the papers, which fine-tune pretrained models that already solve
part of each prompt, where a random start has p ≈ 1/32 on every prompt. The output names the
commit it ran at and whether the tree had uncommitted changes, so a table copied from it can
cite its code.

A method may name its loss aggregation after an `@`: `dynamo@prompt-mean` is the dynamo method
with `loss.loss_agg_mode = "prompt-mean"` (docs/estimators.md); the ratios stay to `grpo`, the
method's own aggregation (token-mean):

    python -m benchmarks.sample_efficiency --methods grpo,grpo@prompt-mean,dynamo@prompt-mean

`--seed_offset S` runs seeds S .. S + seeds - 1 (a table extended by more seeds need not rerun
the first ones); `--baseline M` takes the ratios to method M instead of `grpo` (e.g.
`grpo@prompt-mean`, to compare only prompt-mean methods).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.harness import header, source_revision

# The default table; `--methods` takes any of configs/base.py's METHODS (configs/tiny.py's).
METHODS = ("grpo", "dynamo", "e3", "dynamo_no_dra", "dynamo_no_modulation", "dynamo_as_run")
# Per-prompt accuracy averaged uniformly over the step's prompts: the rollout-weighted batch mean
# would favour DynaMO, which gives more rollouts to some prompts than to others.
METRIC = "reward/prompt_mean"
WINDOW = 5


def steps_to_target(rewards: list[float], target: float) -> int | None:
    """First step (1-based) whose trailing WINDOW-step mean reward is >= target."""
    for i in range(len(rewards)):
        window = rewards[max(0, i - WINDOW + 1) : i + 1]
        if len(window) == WINDOW and sum(window) / WINDOW >= target:
            return i + 1
    return None


def wrong_problems(workdir: Path, config) -> list[str]:
    """Problems whose most likely first token under the final policy is not the gold digit."""
    import jax
    import numpy as np

    from dynamo_jax import tasks
    from dynamo_jax.export import restore_params
    from dynamo_jax.models import qwen

    _, params = restore_params(workdir, config, None)
    task = tasks.build_task(config)
    prompts = task.prompt_tokens
    width = max(map(len, prompts))
    tokens = np.full((len(prompts), width), task.pad_id, np.int32)
    mask = np.zeros_like(tokens)
    for i, p in enumerate(prompts):  # left-padded, as the engine lays prompts out
        tokens[i, width - len(p) :], mask[i, width - len(p) :] = p, 1
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
    logits = qwen.forward(params, config.model, tokens, positions, mask)[:, -1]
    probs = np.asarray(jax.nn.softmax(logits, -1))
    out = []
    for i, answer in enumerate(task.answers):
        top = int(probs[i].argmax())
        if task.decode([top]) != answer:
            text = task.decode(list(prompts[i])).split("user\n")[-1].split("=")[0] + "="
            out.append(f"{text}{task.decode([top])} (p={probs[i, top]:.2f}, gold {answer})")
    return out


def run_one(
    method: str, task: str, seed: int, steps: int, workdir: str, diagnose: bool, init: str = ""
) -> dict:
    """One tiny run; `init`: an HF directory to start from instead of a random initialisation."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from configs import tiny
    from dynamo_jax.config import from_config_dict
    from dynamo_jax.loop import train
    from dynamo_jax.reporting.metrics import read_metrics

    t0 = time.perf_counter()
    method, _, agg = method.partition("@")
    config = tiny.get_config(f"method={method},task={task}")
    if agg:
        config.loss.loss_agg_mode = agg
    config.init.checkpoint = init
    config.train.seed = seed
    config.train.steps = steps
    config.logging.progress_bar = False
    config.logging.tensorboard = False
    config.logging.plots_at_end = False
    config.checkpoint.every_steps = steps
    config.eval.every_steps = 0
    run_cfg = from_config_dict(config)
    train.run(run_cfg, Path(workdir))
    records = read_metrics(Path(workdir))
    rewards = [r[METRIC] for r in records]
    # Rollouts generated per step: the budget, or more with dynamic sampling (its extra rounds).
    generated = [r.get("dynamic/rollouts_generated", run_cfg.budget) for r in records]
    wrong = wrong_problems(Path(workdir), run_cfg) if diagnose else []
    return {
        "rewards": rewards,
        "generated": generated,
        "wrong": wrong,
        "seconds": time.perf_counter() - t0,
    }


def run_order(methods: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """Seed-major (method, seed) pairs, so a run stopped early has every method's first seeds."""
    return [(m, s) for s in seeds for m in methods]


def tiny_methods() -> tuple[str, ...]:
    """configs/tiny.py's methods, configs/base.py's METHODS (called in a pool process: importing
    the configs loads JAX)."""
    from configs import base

    return base.METHODS


def warm_start(task: str, steps: int, tmp: str) -> str:
    """An HF directory of the policy GRPO reaches in `steps` steps (seed 1000, kept apart from
    the compared runs' seeds 0..): the shared start of every run with --warm_start."""
    from dynamo_jax.export import export

    res = run_one("grpo", task, 1000, steps, f"{tmp}/warm", False)
    print(
        f"warm start: GRPO for {steps} steps, last 10-step reward {sum(res['rewards'][-10:]) / 10:.3f}"
    )
    return str(export(f"{tmp}/warm", f"{tmp}/warm_hf", dtype="float32"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="max", help="configs/tiny.py's task: max | mixed")
    parser.add_argument("--seeds", type=int, default=5, help="how many seeds")
    parser.add_argument(
        "--seed_offset", type=int, default=0, help="the first seed (seeds offset .. offset+seeds-1)"
    )
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--targets", default="0.5,0.7,0.9")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    parser.add_argument("--diagnose", action="store_true")
    parser.add_argument("--baseline", default="grpo", help="the method the ratios are to")
    parser.add_argument(
        "--warm_start",
        type=int,
        default=0,
        help="start every run from the policy GRPO reaches in this many steps (0 = random init)",
    )
    args = parser.parse_args()
    import numpy as np

    revision = source_revision()
    print(header(f"sample_efficiency {' '.join(sys.argv[1:]) or '(defaults)'}"), flush=True)

    targets = [float(t) for t in args.targets.split(",")]
    methods = [m for m in args.methods.split(",") if m]
    if args.baseline not in methods:
        parser.error(f"--methods must include the baseline {args.baseline} (the ratios are to it)")
    if args.seeds < 1 or args.seed_offset < 0:
        parser.error("--seeds must be >= 1 and --seed_offset >= 0")
    seeds = list(range(args.seed_offset, args.seed_offset + args.seeds))
    runs = run_order(methods, seeds)
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(args.jobs) as pool:
        known = pool.submit(tiny_methods).result()
        unknown = [m for m in methods if m.partition("@")[0] not in known]
        if unknown:
            parser.error(f"--methods: {unknown} not in configs/tiny.py's METHODS {known}")
        init = ""
        if args.warm_start:  # in a pool process too: JAX stays out of this parent process
            init = pool.submit(warm_start, args.task, args.warm_start, tmp).result()
        futures = {
            (m, s): pool.submit(
                run_one, m, args.task, s, args.steps, f"{tmp}/{m}_{s}", args.diagnose, init
            )
            for m, s in runs
        }
        results = {}
        for (method, seed), future in futures.items():
            res = results[method, seed] = future.result()
            hits = [steps_to_target(res["rewards"], t) for t in targets]
            print(
                f"{method:33s} seed {seed}: steps to {targets} = {hits}, final 10-step reward "
                f"{np.mean(res['rewards'][-10:]):.3f}, {np.mean(res['generated']):.0f} rollouts "
                f"generated per step ({res['seconds']:.0f} s)",
                flush=True,
            )
            if res["wrong"]:
                print(f"    wrong greedy answers: {', '.join(res['wrong'])}", flush=True)

    def median_steps(method: str, target: float) -> tuple[float, int]:
        hits = [steps_to_target(results[method, s]["rewards"], target) for s in seeds]
        misses = sum(h is None for h in hits)
        return float(np.median([args.steps + 1 if h is None else h for h in hits])), misses

    print(
        f"\ntask {args.task}"
        + (f", from GRPO's step-{args.warm_start} policy" if args.warm_start else "")
        + f" ({revision})"
        + f": median steps to the per-prompt mean reward (seeds {seeds[0]}..{seeds[-1]}, "
        f"{args.steps} steps, equal budget; a miss counts as {args.steps + 1}); ratio to GRPO; "
        f"misses (ratio to {args.baseline}):"
    )
    print(
        f"  {'method':33s}" + "".join(f"   to {t:<17}" for t in targets) + "  final  rollouts/step"
    )
    for method in methods:
        cells = []
        for target in targets:
            med, misses = median_steps(method, target)
            ref, _ = median_steps(args.baseline, target)
            cells.append(f"{med:6.1f} {med / ref:5.2f}x  {misses}/{args.seeds}  ")
        final = np.median([np.mean(results[method, s]["rewards"][-10:]) for s in seeds])
        # Dynamic sampling generates more than the budget per step: steps to a target are then
        # not samples to it.
        per_step = np.median([np.mean(results[method, s]["generated"]) for s in seeds])
        print(f"  {method:33s}   " + "".join(cells) + f"{final:.3f}  {per_step:.0f}")


if __name__ == "__main__":
    main()
