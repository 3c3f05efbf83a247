"""The measurement of benchmarks/gradient_variance.py for one policy: the warm-up history, each
allocation's n_i, the reference gradient, sigma_i and the gradient draws (the docstring there
says what each is). The allocation sections come from `config_of(method)`, a RunConfig of the
measured config file with that method (configs/tiny.py's, or `--config`'s).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np

from benchmarks.gradient_variance_pipeline import Pipeline
from benchmarks.gradient_variance_stats import DrawStats, DrawStore, total_variance

# name -> (the config's method whose allocation section it uses, policy override)
ALLOCATIONS = {
    "uniform": ("grpo", None),
    "dynamo": ("dynamo", None),
    "dynamo_as_run": ("dynamo_as_run", None),
    "dynamo_released": ("dynamo", "dynamo_released"),
    "e3": ("e3", None),
    "dynamo_posterior": ("dynamo_posterior", None),
    "dynamo_std": ("dynamo_std", None),
    "dynamo_entropy": ("dynamo_entropy", None),
    "dynamo_posterior_std": ("dynamo_posterior_std", None),
    # n ∝ the measured sigma_i (water-filled in dynamo's bounds): Appendix C's rule with the
    # true sigma, which no allocator knows; it separates a poor proxy from a poor principle.
    "oracle_sigma": (None, None),
}
# Random streams of one (task, stage): SeedSequence([seed, task, stage, stream, index, chunk]).
WARMUP, REFERENCE, SIGMA, DRAWS = range(4)
WARMUP_ROUNDS = 2
STATS_FIELDS = ("count", "correct", "reward_sum", "entropy_mean")
DRAWS_PER_CALL = 16

ConfigOf = Callable[[str], object]  # method -> RunConfig of the measured config file


def stream_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


@dataclasses.dataclass(frozen=True)
class GradientPlan:
    """The gradients one policy's measurement computes, per kind: (count, batch shape) with the
    shape (prompts, rollouts per prompt) as Pipeline.gradient is given it."""

    reference: tuple[int, tuple[int, int]]
    sigma: tuple[int, tuple[int, int]]
    draws: tuple[int, tuple[int, int]]  # at most: an allocation with another's n_i is skipped

    @classmethod
    def of(cls, args, prompts: int, n_avg: int) -> GradientPlan:
        return cls(
            (args.reference, (prompts, args.reference_n)),
            (prompts * args.sigma_draws, (1, n_avg)),
            (len(args.allocations) * args.draws, (prompts, n_avg)),
        )

    @property
    def kinds(self) -> tuple[tuple[int, tuple[int, int]], ...]:
        return (self.reference, self.sigma, self.draws)

    @property
    def rows(self) -> int:
        return sum(count * p * n for count, (p, n) in self.kinds)

    def __str__(self) -> str:
        (r, rs), (s, ss), (d, ds) = self.kinds
        return (
            f"{r + s + d} gradient computations: reference {r} x {rs[0] * rs[1]} completions, "
            f"sigma_i {s} x {ss[0] * ss[1]}, draws up to {d} x {ds[0] * ds[1]} (the budget); "
            f"{self.rows} completions in all"
        )


class Progress:
    """Prints the estimated wall time of the measurement at the first gradient that compiled
    nothing, and again at each quarter of the planned completions: each kind's gradients left
    at its own shape's measured seconds (a shape not yet timed at the seconds per completion of
    those that were), plus the sampling time per completion so far."""

    def __init__(self, plan: GradientPlan, pipe: Pipeline):
        self.plan, self.clock, self.start = plan, pipe.clock, len(pipe.clock.rows)
        self.quarter, self.timed = 0, False

    def seconds_left(self) -> float:
        clock, done = self.clock, self.clock.shapes[self.start :]
        left = 0.0
        for count, shape in self.plan.kinds:
            todo = max(count - done.count(shape), 0)
            each = clock.seconds_per_gradient(shape)
            if np.isnan(each):
                each = shape[0] * shape[1] * clock.seconds_per_row()
            left += todo * (each + shape[0] * shape[1] * clock.sampling_per_row())
        return left

    def step(self) -> None:
        done = sum(self.clock.rows[self.start :])
        quarter = 4 * done // max(self.plan.rows, 1)
        first_timed = not self.timed and not all(self.clock.compiled[self.start :])
        if not first_timed and quarter <= self.quarter:
            return
        self.timed = self.timed or first_timed
        self.quarter = max(self.quarter, quarter)
        _, (prompts, n) = self.plan.draws
        draw = self.clock.seconds_per_gradient((prompts, n))
        draw_note = "" if np.isnan(draw) else f"; one draw's gradient {draw:.2f} s"
        print(
            f"  {done} of {self.plan.rows} completions' gradients done; "
            f"{self.clock.seconds_per_row():.3f} s per completion (scoring, passes, update; "
            f"compiling left out) and {self.clock.sampling_per_row():.3f} s sampling"
            f"{draw_note}: ~{self.seconds_left() / 60:.1f} min to go",
            flush=True,
        )


def warmup_rounds(pipe: Pipeline, rows: np.ndarray, per_prompt: int, seed_parts) -> list[dict]:
    """Group stats (by row) of `WARMUP_ROUNDS` independent samples of the policy."""
    each = per_prompt // WARMUP_ROUNDS
    out = []
    for r in range(WARMUP_ROUNDS):
        pool = pipe.sample(rows, np.full(rows.size, each), stream_seed(*seed_parts, WARMUP, r))
        completions = [c for row in rows for c in pool[int(row)]]
        _, _, groups = pipe.batch(completions, rows.size, each)
        out.append({k: pipe.by_row(groups, rows, k) for k in STATS_FIELDS} | {"row": rows})
    return out


def allocation_config(name: str, config_of: ConfigOf):
    """The AllocationConfig of allocation `name`: its method's section of the config file."""
    method, policy = ALLOCATIONS[name]
    acfg = config_of(method).allocation
    return acfg if policy is None else dataclasses.replace(acfg, policy=policy)


def allocation_of(
    name: str, config_of: ConfigOf, rounds: list[dict], rows: np.ndarray, num_prompts: int
):
    """n_i of allocation `name` after the warm-up history."""
    from dynamo_jax.allocation import make_allocator, make_history

    acfg = allocation_config(name, config_of)
    allocator, history = make_allocator(acfg), make_history(acfg, num_prompts)
    for g in rounds:  # as rl_step.record feeds it, one epoch per round
        history.update(
            g["row"], g["count"], g["correct"], g["reward_sum"], entropy_mean=g["entropy_mean"]
        )
        allocator.on_epoch_end(history)
    budget = rows.size * acfg.n_avg
    return np.asarray(allocator.allocate(rows, history, budget).n, np.int64)


def oracle_allocation(config_of: ConfigOf, sigma2: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """n_i ∝ sigma_i by Alg. 1's water-fill within the `dynamo` method's bounds."""
    from dynamo_jax.allocation.water_level import water_fill

    acfg = config_of("dynamo").allocation
    sigma = np.sqrt(np.maximum(sigma2, 0.0))
    return water_fill(sigma, rows, rows.size * acfg.n_avg, acfg.g_min, acfg.g_max)


def draw_gradients(pipe, rows, n, draws, n_avg, seed_parts, progress, g_ref) -> DrawStats:
    """The `DrawStats` of the gradients of `draws` independent batches of n[i] rollouts."""
    with DrawStore(draws) as store:
        for chunk in range(math.ceil(draws / DRAWS_PER_CALL)):
            k = min(DRAWS_PER_CALL, draws - chunk * DRAWS_PER_CALL)
            pool = pipe.sample(rows, n * k, stream_seed(*seed_parts, chunk))
            for d in range(k):
                completions = [
                    c for row, m in zip(rows, n) for c in pool[int(row)][d * m : (d + 1) * m]
                ]
                store.add(pipe.gradient(completions, rows.size, n_avg, stats=False)[0])
                progress.step()
        return store.stats(g_ref)


def sigma_squared(
    pipe, rows, n_avg, draws, seed_parts, progress
) -> tuple[np.ndarray, list[np.ndarray]]:
    """sigma_i^2 = n_avg E||h_i - E h_i||^2, h_i the gradient of prompt i's n_avg rollouts alone;
    and per prompt the Gram matrix of its `draws` h_i (for bootstrap intervals)."""
    out, grams = np.zeros(rows.size), []
    for i, row in enumerate(rows):
        pool = pipe.sample(
            np.asarray([row]), np.asarray([n_avg * draws]), stream_seed(*seed_parts, i)
        )
        with DrawStore(draws) as store:
            for d in range(draws):
                completions = pool[int(row)][d * n_avg : (d + 1) * n_avg]
                store.add(pipe.gradient(completions, 1, n_avg, stats=False)[0])
                progress.step()
            grams.append(store.stats(None).gram)
        out[i] = n_avg * total_variance(grams[-1])
    return out, grams


def reference(pipe: Pipeline, rows, batches: int, per_prompt: int, seed_parts, progress) -> dict:
    """The reference gradient (mean of large uniform batches), its noise Var(g_ref), and p_i
    and H_i (mean token entropy) from the same rollouts; with no batches, g_ref is None."""
    if batches == 0:
        return {"g_ref": None, "ref_noise": float("nan")}
    correct, count, entropy = 0.0, 0.0, 0.0
    with DrawStore(batches) as store:
        for r in range(batches):
            pool = pipe.sample(rows, np.full(rows.size, per_prompt), stream_seed(*seed_parts, r))
            completions = [c for row in rows for c in pool[int(row)]]
            grad, groups = pipe.gradient(completions, rows.size, per_prompt)
            store.add(grad)
            progress.step()
            correct = correct + pipe.by_row(groups, rows, "correct")
            count = count + pipe.by_row(groups, rows, "count")
            entropy = entropy + pipe.by_row(groups, rows, "entropy_mean") / batches
        ref = store.stats(None)
    return {
        "g_ref": ref.mean,
        "ref_noise": total_variance(ref.gram) / batches,
        "p": correct / count,
        "entropy": entropy,
    }


def measure_stage(
    args, pipe: Pipeline, config_of: ConfigOf, task: str, task_index: int, stage: int
) -> dict:
    """Everything the tables print for the policy `pipe` holds (`task` and `stage` name it in
    the tables; `task_index` and `stage` seed its random streams)."""
    cfg, t0 = pipe.cfg, time.perf_counter()
    rows = np.asarray(next(pipe.task.iterator(cfg.data.seed, cfg.train.prompts_per_step)).indices)
    n_avg, base = cfg.allocation.n_avg, (args.seed, task_index, stage)
    plan = GradientPlan.of(args, rows.size, n_avg)
    print(f"  {task} step {stage}: {plan}", flush=True)
    progress = Progress(plan, pipe)
    rounds = warmup_rounds(pipe, rows, args.warmup, base)
    allocations = {
        a: allocation_of(a, config_of, rounds, rows, pipe.task.num_prompts)
        if a != "oracle_sigma"
        else None
        for a in args.allocations
    }
    ref = reference(pipe, rows, args.reference, args.reference_n, (*base, REFERENCE), progress)
    sigma2, sigma_grams = sigma_squared(
        pipe, rows, n_avg, args.sigma_draws, (*base, SIGMA), progress
    )
    if "oracle_sigma" in allocations:
        allocations["oracle_sigma"] = oracle_allocation(config_of, sigma2, rows)
    stats: dict[tuple, DrawStats] = {}
    for idx, (name, n) in enumerate(allocations.items()):
        if tuple(n) in stats:  # the same estimator as an allocation already measured
            continue
        stats[tuple(n)] = draw_gradients(
            pipe, rows, n, args.draws, n_avg, (*base, DRAWS, idx), progress, ref["g_ref"]
        )
        print(
            f"  {task} step {stage} {name}: n = {n.tolist()}, variance "
            f"{stats[tuple(n)].variance:.4e} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    warm = {k: sum(g[k] for g in rounds) for k in ("correct", "count")}
    if ref["g_ref"] is None:  # no reference sample: p_i and H_i of the warm-up's
        ref["p"] = warm["correct"] / warm["count"]
        ref["entropy"] = sum(g["entropy_mean"] for g in rounds) / len(rounds)
    return {
        "task": task,
        "stage": stage,
        "n_avg": n_avg,
        "allocations": allocations,
        "stats": stats,
        "sigma2": sigma2,
        "sigma_grams": sigma_grams,
        "warmup_p": warm["correct"] / warm["count"],
        "seconds": time.perf_counter() - t0,
        **ref,
    }
