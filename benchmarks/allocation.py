"""Rollout allocation on a simulated prompt pool: how much of the budget each policy wastes.

A pool of prompts with fixed true success rates p_i drawn from a Beta mixture (many near 0,
many near 1, some in between). Every step takes the next N prompts of a per-epoch shuffle
(the same order for every policy; a partial last batch is dropped, as verl does), asks the
policy for n_i with the same budget B = N · n_avg, draws Binomial(n_i, p_i) correct answers,
updates the history, and calls `on_epoch_end` after each pass. Printed, each as a ratio to
`uniform` measured in the same run:

- wasted share: rollouts spent in groups whose rewards are all equal (zero GRPO advantage);
- signal prompts: prompts per step whose group has mixed rewards (non-zero learning signal);
- variance ratio: the realised total variance Σ σ_i² / n_i of the per-prompt mean-reward
  estimates, σ_i² = p_i (1 − p_i), over uniform's Σ σ_i² / n_avg (summed over steps); the
  paper's Appendix C optimum (Σσ)² / (N Σσ²) of the same batches is printed as the bound.

Policies: uniform, DynaMO's Alg. 1 (dynamo), the allocation the DynaMO authors' script runs
(dynamo_as_run), the DynaMO recipe's other heuristic (dynamo_released), E3, and the options of docs/algorithm.md#allocation-variants
of dynamo (posterior priority, n_i ∝ σ_i, both). The entropy factor is left out: the simulated
pool has no token entropies.

Target (issue 5): dynamo's wasted share <= 0.7 × uniform's.

    python -m benchmarks.allocation [--prompts 10000] [--steps 200] [--batch 256] [--seed 0]
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from benchmarks.harness import header
from dynamo_jax.allocation import AllocationConfig, make_allocator, make_history

# name -> the AllocationConfig fields besides the bounds (shared, from the command line)
POLICIES = {
    "uniform": {"policy": "uniform"},
    "dynamo": {"policy": "dynamo"},
    "dynamo_as_run": {"policy": "dynamo_as_run"},
    "dynamo_released": {"policy": "dynamo_released"},
    "e3": {"policy": "e3"},
    "dynamo_posterior": {"policy": "dynamo", "priority": "posterior"},
    "dynamo_std": {"policy": "dynamo", "allocate_by": "std"},
    "dynamo_posterior_std": {"policy": "dynamo", "priority": "posterior", "allocate_by": "std"},
}


def success_rates(num: int, rng: np.random.Generator) -> np.ndarray:
    """Beta mixture: 40% mostly unsolved, 35% mostly solved, 25% in between."""
    kind = rng.choice(3, size=num, p=[0.40, 0.35, 0.25])
    a = np.choose(kind, [0.2, 5.0, 2.0])
    b = np.choose(kind, [5.0, 0.2, 2.0])
    return rng.beta(a, b)


@dataclasses.dataclass
class Totals:
    rollouts: int = 0
    wasted: int = 0
    signal_prompts: int = 0
    variance: float = 0.0
    uniform_variance: float = 0.0
    optimal_variance: float = 0.0
    shortfall: int = 0
    later_rollouts: int = 0  # steps after the first epoch (every policy is uniform before)
    later_wasted: int = 0


def simulate(fields: dict, p_true: np.ndarray, args) -> Totals:
    cfg = AllocationConfig(n_avg=args.n_avg, g_min=args.g_min, g_max=args.g_max, **fields)
    allocator, history = make_allocator(cfg), make_history(cfg, p_true.size)
    order_rng = np.random.default_rng(args.seed + 1)  # same prompt order for every policy
    reward_rng = np.random.default_rng(args.seed + 2)
    per_epoch = p_true.size // args.batch
    totals, order = Totals(), None
    for step in range(args.steps):
        slot = step % per_epoch
        if slot == 0:
            order = order_rng.permutation(p_true.size)
        idx = order[slot * args.batch : (slot + 1) * args.batch]
        budget = idx.size * args.n_avg
        result = allocator.allocate(idx, history, budget)
        n = result.n
        correct = reward_rng.binomial(n, p_true[idx])
        history.update(idx, n, correct, correct.astype(np.float64))
        mixed = (correct > 0) & (correct < n)
        var = p_true[idx] * (1 - p_true[idx])
        sigma = np.sqrt(var)
        totals.rollouts += int(n.sum())
        totals.wasted += int(n[~mixed].sum())
        totals.signal_prompts += int(mixed.sum())
        totals.variance += float(np.sum(np.where(var > 0, var / np.maximum(n, 1), 0.0)))
        totals.uniform_variance += float(var.sum() / args.n_avg)
        totals.optimal_variance += float(sigma.sum() ** 2 / budget)
        totals.shortfall += result.shortfall
        if step >= per_epoch:
            totals.later_rollouts += int(n.sum())
            totals.later_wasted += int(n[~mixed].sum())
        if slot == per_epoch - 1:
            allocator.on_epoch_end(history)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--n-avg", dest="n_avg", type=int, default=8)
    parser.add_argument("--g-min", dest="g_min", type=int, default=2)
    parser.add_argument("--g-max", dest="g_max", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    p_true = success_rates(args.prompts, np.random.default_rng(args.seed))
    epochs = args.steps / (args.prompts // args.batch)
    print(header("allocation"))
    print(
        f"pool {args.prompts} prompts (p<0.05: {np.mean(p_true < 0.05):.0%}, "
        f"p>0.95: {np.mean(p_true > 0.95):.0%}), {args.steps} steps x {args.batch} prompts "
        f"(~{epochs:.1f} epochs), n_avg={args.n_avg}, G in [{args.g_min}, {args.g_max}]"
    )
    results = {name: simulate(fields, p_true, args) for name, fields in POLICIES.items()}
    base = results["uniform"]
    base_waste = base.wasted / base.rollouts
    print(
        f"uniform: wasted share {base_waste:.4f}, signal prompts/step "
        f"{base.signal_prompts / args.steps:.1f}; Appendix-C optimum (Σσ)²/(NΣσ²) = "
        f"{base.optimal_variance / base.uniform_variance:.4f}"
    )
    print(
        f"{'policy':<22}{'wasted share':>14}{'(after ep. 1)':>15}{'signal prompts':>16}"
        f"{'variance':>10}{'shortfall':>11}   (ratios to uniform)"
    )
    # No step after the first epoch (a run shorter than one pass over the pool), or a uniform
    # run that wasted nothing there: that column has no ratio (nan), not a division error.
    base_later = base.later_wasted / max(base.later_rollouts, 1)
    for policy, t in results.items():
        waste = (t.wasted / t.rollouts) / base_waste if base_waste else float("nan")
        later_share = t.later_wasted / max(t.later_rollouts, 1)
        later = later_share / base_later if base_later else float("nan")
        signal = t.signal_prompts / base.signal_prompts
        variance = t.variance / t.uniform_variance
        print(
            f"{policy:<22}{waste:>14.3f}{later:>15.3f}{signal:>16.3f}{variance:>10.3f}"
            f"{t.shortfall:>11d}"
        )
    ratio = (
        (results["dynamo"].wasted / results["dynamo"].rollouts) / base_waste if base_waste else 1.0
    )
    print(
        f"target dynamo wasted share <= 0.7x uniform: {ratio:.3f}x -> "
        f"{'met' if ratio <= 0.7 else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
