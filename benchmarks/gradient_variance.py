"""Does the rollout allocation lower the variance of the real policy-gradient estimate?

    python -m benchmarks.gradient_variance [--tasks max,mixed] [--stages 0,40,100] [--draws 200]
    python -m benchmarks.gradient_variance --tasks mixed --stages 100 --draws 400 --workdir W

For a fixed policy (configs/tiny.py's model at several stages of one GRPO run: `--stages`,
0 = its random initialisation, K = after K GRPO steps, seed `--policy_seed`; the same policies
`sample_efficiency.py --warm_start K` starts from) and a fixed batch of N = 16 prompts (the
run's first batch), it compares the allocations of the same budget B = 16 x 8 rollouts:
uniform (GRPO), dynamo (the paper's Alg. 1), dynamo_as_run (the authors' script),
dynamo_released (the recipe's other heuristic), e3 and the options of docs/algorithm.md#allocation-variants
(dynamo_posterior, dynamo_std, dynamo_entropy, dynamo_posterior_std), each with the allocation
section of its configs/tiny.py method.

How it is measured:
- History: every allocator gets the same per-prompt history, built from an independent
  warm-up sample of the policy (`--warmup` rollouts per prompt, 64 by default: p_i then has a
  standard error of at most 0.06), fed in two rounds as the training loop feeds it (counts,
  correct counts, the old-log-prob pass's mean token entropy), each round followed by the
  epoch-end hook (E3 is then at its run's bounds [4, 12], the released heuristic has its
  per-epoch priority). The allocation n_i is a deterministic function of that history.
- Gradient: each draw samples n_i fresh rollouts per prompt at T = 1 and runs the training
  loop's own stages on them (`tasks.score_completions`, `assemble.build_batch`,
  `behaviour_pass.old_logprobs`, `rl_step.update`) with
  the whole batch as one mini-batch (one update: the loss over all B rows), the loss of
  `--loss_method`'s config (GRPO's plain clipped surrogate by default, the policy's own run).
  The optimizer is `capture_gradient()`: zero updates, the incoming gradient kept as its
  state, so the gradient is read exactly (before clipping) and the parameters never move.
- Variance: E||g - E g||^2 over `--draws` independent batches per allocation, its ratio to
  uniform's with a 95% bootstrap interval (draws resampled within each allocation).
- Bias: against a reference gradient, the mean over `--reference` uniform batches of
  `--reference_n` rollouts per prompt: the mean squared cosine E cos^2(g, g_ref) and the
  squared bias ||E g - g_ref||^2 / ||g_ref||^2 (both noise terms subtracted).
- sigma_i: prompt i's share of the variance. sigma_i^2 = n_avg * E||h_i - E h_i||^2, h_i the
  real step's gradient on a batch of prompt i's n_avg rollouts alone (`--sigma_draws` draws):
  h_i is prompt i's per-rollout mean gradient, so a per-prompt mean over n_i rollouts has
  variance sigma_i^2 / n_i. With equal response lengths the uniform batch's gradient is
  (1/N) sum h_i, so its variance is sum sigma_i^2 / (N^2 n_avg) (printed as a check).
  From the measured sigma_i: the Appendix-C optimum (sum sigma)^2 / (N sum sigma^2), and for
  each allocation two predicted ratios to uniform: Appendix C's model, where prompts are
  averaged with equal weights (variance sum sigma_i^2 / n_i), and the token-mean model, where
  the loss averages over all rollouts so prompt i weighs n_i / B (variance
  sum n_i sigma_i^2 / B^2).
- Does P_i = p_i (1 - p_i) track sigma_i^2? Spearman rank correlation over the N prompts, with
  p_i and H_i (mean token entropy) from the reference sample; also P_i f(H_i)^2,
  f(H) = sqrt(1 - exp(-H)) (Eq. 42), and 1 - p^n - (1 - p)^n, the chance that a group of n_avg
  has mixed rewards (a non-zero GRPO advantage).

`--loss_agg_mode MODE` (token-mean, seq-mean-token-mean, seq-mean-token-sum-norm, prompt-mean)
measures the loss's gradient under that aggregation (default: the loss method's own, token-mean);
sigma_i is then measured under the same mode. Under prompt-mean the batch gradient is
(1/N) sum h_i(n_i) exactly, so Appendix C's model is the prediction to test; the table gives it
a 95% interval too (sigma_i's draws bootstrapped per prompt, the allocations held fixed).

Prints markdown tables and the commit it ran at. The GRPO policies are trained once per task
into `--workdir` (reused when it already holds them).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from benchmarks.harness import header, source_revision

# name -> (configs/tiny.py method whose allocation section it uses, policy override)
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
ENGINE_BATCH = 1024  # rows per sampler program: the draws are pooled into few engine calls
DRAWS_PER_CALL = 16


# ----------------------------------------------------------------------------- statistics


def total_variance(gram: np.ndarray) -> float:
    """Unbiased E||g - E g||^2 of D draws from their Gram matrix K[d, e] = g_d . g_e."""
    d = gram.shape[0]
    return float((np.trace(gram) - gram.sum() / d) / (d - 1))


def bootstrap_variances(gram: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """`total_variance` of `resamples` bootstrap resamples of the draws (rows of counts w:
    sum_d w_d K_dd - w^T K w / D, over D - 1)."""
    d = gram.shape[0]
    w = rng.multinomial(d, np.full(d, 1.0 / d), size=resamples).astype(np.float64)
    quad = np.einsum("rd,de,re->r", w, gram, w)
    return (w @ np.diag(gram) - quad / d) / (d - 1)


def appendix_c_optimum(sigma: np.ndarray) -> float:
    """(sum sigma)^2 / (N sum sigma^2): the n ∝ sigma allocation's variance over uniform's
    when prompts are averaged with equal weights (paper Appendix C)."""
    return float(sigma.sum() ** 2 / (sigma.size * np.sum(sigma**2)))


def prompt_mean_ratio(sigma2: np.ndarray, n: np.ndarray, n_avg: float) -> float:
    """sum sigma_i^2 / n_i over sum sigma_i^2 / n_avg (Appendix C's model of the estimator)."""
    keep = sigma2 > 0
    return float(np.sum(sigma2[keep] / n[keep]) / (np.sum(sigma2) / n_avg))


def token_mean_ratio(sigma2: np.ndarray, n: np.ndarray, n_avg: float) -> float:
    """sum n_i sigma_i^2 over n_avg sum sigma_i^2: the variance ratio when the loss averages
    over all rollouts (prompt i weighs n_i / B; its mean's variance is sigma_i^2 / n_i)."""
    return float(np.sum(n * sigma2) / (n_avg * np.sum(sigma2)))


def mixed_group_probability(p: np.ndarray, n: int) -> np.ndarray:
    """Chance that n rollouts of success rate p are neither all right nor all wrong."""
    return 1.0 - p**n - (1.0 - p) ** n


@dataclasses.dataclass(frozen=True)
class DrawStats:
    """What the tables need of D gradient draws: their Gram matrix and mean, and their dot
    products with the reference gradient."""

    gram: np.ndarray  # float64 [D, D]
    mean: np.ndarray  # float64 [P]
    ref_dot: np.ndarray  # float64 [D]

    @classmethod
    def of(cls, grads: np.ndarray, g_ref: np.ndarray) -> DrawStats:
        g = grads.astype(np.float64)
        return cls(g @ g.T, g.mean(0), g @ g_ref)

    @property
    def variance(self) -> float:
        return total_variance(self.gram)

    def mean_cos2(self, g_ref: np.ndarray) -> float:
        """E cos^2(g_d, g_ref) over the draws."""
        norms = np.diag(self.gram) * float(g_ref @ g_ref)
        return float(np.mean(np.where(norms > 0, self.ref_dot**2 / np.maximum(norms, 1e-300), 0)))

    def relative_bias2(self, g_ref: np.ndarray, ref_noise: float) -> float:
        """(||mean - g_ref||^2 - Var/D - Var(g_ref)) / ||g_ref||^2: squared bias, noise removed."""
        d = self.gram.shape[0]
        diff = self.mean - g_ref
        return float((diff @ diff - self.variance / d - ref_noise) / (g_ref @ g_ref))


# ----------------------------------------------------------------------------- the pipeline


def capture_gradient():
    """An optax transformation that applies no update and keeps the incoming gradient as its
    state: the train step's state then holds exactly the gradient it computed."""
    import jax
    import jax.numpy as jnp
    import optax

    def init(params):
        return jax.tree.map(jnp.zeros_like, params)

    def update(grads, state, params=None):
        del state, params
        return jax.tree.map(jnp.zeros_like, grads), grads

    return optax.GradientTransformation(init, update)


def sized_config(cfg, prompts: int, n_avg: int):
    """`cfg` with a batch of `prompts` prompts x `n_avg` rollouts taken as one mini-batch."""
    from dynamo_jax.allocation import AllocationConfig

    train_cfg = dataclasses.replace(
        cfg.train, prompts_per_step=prompts, mini_batch_size=prompts * n_avg, ppo_epochs=1
    )
    alloc = AllocationConfig(policy="uniform", n_avg=n_avg, g_min=2, g_max=max(n_avg, 2))
    return dataclasses.replace(cfg, train=train_cfg, allocation=alloc)


@dataclasses.dataclass
class _Shape:
    cfg: object  # RunConfig sized to the batch
    logprob: object
    step: object = None  # TrainStep, built on first use
    state: object = None  # its TrainState (donated and replaced at every call)


class Pipeline:
    """The training loop's stages for one fixed policy: sample → score → build_batch →
    old_logprobs → one update whose optimizer captures the gradient."""

    def __init__(self, cfg, params, workdir: str):
        import jax

        from dynamo_jax import tasks
        from dynamo_jax.engine_factory import build_engine
        from dynamo_jax.sharding.mesh import build_mesh
        from dynamo_jax.step.forward import model_param_shardings
        from dynamo_jax.temperature import TemperatureScheduler

        self.cfg = cfg
        self.mesh = build_mesh(cfg.mesh, jax.devices()[:1])
        self.task = tasks.build_task(cfg)
        self.temperature = TemperatureScheduler(cfg.temperature).current()
        shardings = model_param_shardings(cfg.model, self.mesh, cfg.mesh.rules)
        self.params = jax.device_put(params, shardings)
        engine_cfg = dataclasses.replace(
            cfg, jax_engine=dataclasses.replace(cfg.jax_engine, max_batch=ENGINE_BATCH)
        )
        self.engine = build_engine(engine_cfg, self.params, self.mesh, shardings, workdir)
        self._shardings = shardings
        self._shapes: dict[tuple[int, int], _Shape] = {}
        self._version = 0

    def set_params(self, params) -> None:
        """Measure another policy with the functions already compiled."""
        import jax

        from dynamo_jax.step.state import train_state_from_params

        self.params = jax.device_put(params, self._shardings)
        self._version += 1
        self.engine.update_weights(self.params, self._version)
        for shape in self._shapes.values():
            if shape.step is not None:
                shape.state = train_state_from_params(
                    self.params, capture_gradient(), shape.step.state_shardings
                )

    def close(self) -> None:
        self.engine.close()
        self.task.close()

    def sample(self, rows: np.ndarray, n: np.ndarray, seed: int) -> dict[int, list]:
        """n[i] completions of dataset row rows[i], by row."""
        from dynamo_jax.rollout.protocol import Request, SamplingParams

        task = self.task
        requests = [
            Request(int(task.prompt_ids[r]), task.prompt_tokens[r], int(k))
            for r, k in zip(rows, n)
            if k > 0
        ]
        sampling = SamplingParams(
            max_new_tokens=self.cfg.rollout.max_new_tokens,
            temperature=self.temperature,
            top_p=self.cfg.rollout.top_p,
            top_k=self.cfg.rollout.top_k,
            stop_token_ids=task.stop_token_ids,
            seed=seed,
        )
        completions = self.engine.generate(requests, sampling)
        by_id: dict[int, list] = {}
        for c in completions:
            by_id.setdefault(c.prompt_id, []).append(c)
        return {int(r): by_id.get(int(task.prompt_ids[r]), []) for r in rows}

    def _shape(self, prompts: int, n_avg: int, with_step: bool) -> _Shape:
        from dynamo_jax.step.forward import make_logprob_fn
        from dynamo_jax.step.state import train_state_from_params
        from dynamo_jax.step.train_step import make_train_step

        key = (prompts, n_avg)
        if key not in self._shapes:
            cfg = sized_config(self.cfg, prompts, n_avg)
            logprob_layout = self._layouts(cfg).logprob_pass
            logprob = make_logprob_fn(cfg.model, self.mesh, cfg.mesh.rules, logprob_layout)
            self._shapes[key] = _Shape(cfg, logprob)
        shape = self._shapes[key]
        if with_step and shape.step is None:
            optimizer = capture_gradient()
            cfg = shape.cfg
            train_layout = self._layouts(cfg).update
            shape.step = make_train_step(
                cfg.model,
                cfg.loss,
                optimizer,
                self.mesh,
                cfg.mesh.rules,
                batch_size=train_layout.max_rows,
                micro_batches=train_layout.max_micro_batches,
                seed=cfg.train.seed,
            )
            shape.state = train_state_from_params(
                self.params, optimizer, shape.step.state_shardings
            )
        return shape

    def _layouts(self, cfg):
        """The row layouts build.build_trainer gives this config (assemble.StepLayouts)."""
        from dynamo_jax.loop.assemble import step_layouts
        from dynamo_jax.sharding.rules import row_shards

        return step_layouts(cfg, row_shards(self.mesh.shape, cfg.mesh.rules))

    def batch(self, completions: list, prompts: int, n_avg: int, with_step: bool = False):
        """(shape, the scored RolloutBatch with old log-probs and entropy, its group stats)."""
        from dynamo_jax import tasks
        from dynamo_jax.loop import assemble, behaviour_pass

        shape = self._shape(prompts, n_avg, with_step)
        rewards = np.zeros(shape.cfg.budget, np.float32)
        rewards[: len(completions)], _ = tasks.score_completions(self.task, completions)
        batch = assemble.build_batch(shape.cfg, self.task, completions, self.temperature, rewards)
        logprob = shape.logprob
        rows = assemble.device_rows(
            batch, np.arange(batch.rows), logprob.layout, logprob.batch_shardings
        )
        batch = behaviour_pass.old_logprobs(batch, rows, logprob, self.params, None)
        groups = assemble.group_stats(
            batch.prompt_id, batch.rewards, batch.valid, batch.entropy, batch.loss_mask
        )
        return shape, batch, groups

    def gradient(self, completions: list, prompts: int, n_avg: int) -> tuple[np.ndarray, dict]:
        """The training loss's gradient on these completions (float64, flattened), and the
        batch's group stats."""
        import jax
        from jax.flatten_util import ravel_pytree

        from dynamo_jax.loop import assemble, rl_step

        shape, batch, groups = self.batch(completions, prompts, n_avg, with_step=True)
        # update() reads these of the Trainer (loop/build.py); a full one would build an engine
        trainer = SimpleNamespace(
            cfg=shape.cfg,
            layouts=self._layouts(shape.cfg),
            train_step=shape.step,
            state=shape.state,
            consecutive_nonfinite=0,
        )
        order = assemble.mini_batch_order(shape.cfg, 0, batch.rows)
        state, result = rl_step.update(trainer, batch, order)
        shape.state = state
        if any(result.skipped):
            raise FloatingPointError("non-finite loss or gradient in a measured batch")
        flat, _ = ravel_pytree(jax.device_get(state.opt_state))
        return np.asarray(flat, np.float64), groups

    def by_row(self, groups: dict, rows: np.ndarray, field: str) -> np.ndarray:
        """A group-stats field (groups are sorted by prompt id) in the order of `rows`."""
        position = {int(i): k for k, i in enumerate(groups["prompt_id"])}
        return np.asarray([groups[field][position[int(self.task.prompt_ids[r])]] for r in rows])


# ----------------------------------------------------------------------------- the policies


def tiny_config(task: str, method: str, seed: int):
    from configs import tiny
    from dynamo_jax.config import from_config_dict

    config = tiny.get_config(f"method={method},task={task}")
    config.train.seed = seed
    config.logging.progress_bar = False
    config.logging.tensorboard = False
    config.logging.plots_at_end = False
    config.eval.every_steps = 0
    return from_config_dict(config)


def policy_params(task: str, stage: int, stages: list[int], seed: int, workdir: Path):
    """The parameters of GRPO's run (configs/tiny.py:method=grpo, `seed`) after `stage` steps."""
    import jax

    from dynamo_jax.export import restore_params
    from dynamo_jax.loop import train
    from dynamo_jax.models.qwen import init_params

    cfg = tiny_config(task, "grpo", seed)
    if stage == 0:  # the run's random initialisation (build.build_trainer's key)
        return init_params(cfg.model, jax.random.key(seed))
    trained = [s for s in stages if s > 0]
    every = math.gcd(*trained)
    run_cfg = dataclasses.replace(
        cfg,
        train=dataclasses.replace(cfg.train, steps=max(trained)),
        checkpoint=dataclasses.replace(
            cfg.checkpoint, every_steps=every, max_to_keep=max(trained) // every + 1
        ),
    )
    run_dir = workdir / f"grpo_{task}_seed{seed}"
    # Resumes (a no-op when finished); a constant learning rate makes the step-K policy of this
    # run the same as the one `sample_efficiency.py --warm_start K` trains for K steps.
    train.run(run_cfg, run_dir)
    return restore_params(run_dir, run_cfg, stage)[1]


def with_loss_agg_mode(cfg, mode: str):
    """`cfg` with its loss aggregated by `mode` ('' keeps it); seq-mean-token-sum-norm divides by
    the response length limit (Dr.GRPO's constant)."""
    if not mode:
        return cfg
    extra = (
        {"max_len_norm": cfg.rollout.max_new_tokens} if mode == "seq-mean-token-sum-norm" else {}
    )
    return dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, loss_agg_mode=mode, **extra))


# ----------------------------------------------------------------------------- one stage


def stream_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


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


def allocation_of(name: str, task: str, rounds: list[dict], rows: np.ndarray, num_prompts: int):
    """n_i of allocation `name` (its configs/tiny.py allocation) after the warm-up history."""
    from dynamo_jax.allocation import make_allocator, make_history

    method, policy = ALLOCATIONS[name]
    acfg = tiny_config(task, method, 0).allocation
    if policy is not None:
        acfg = dataclasses.replace(acfg, policy=policy)
    allocator, history = make_allocator(acfg), make_history(acfg, num_prompts)
    for g in rounds:  # as rl_step.record feeds it, one epoch per round
        history.update(
            g["row"], g["count"], g["correct"], g["reward_sum"], entropy_mean=g["entropy_mean"]
        )
        allocator.on_epoch_end(history)
    budget = rows.size * acfg.n_avg
    return np.asarray(allocator.allocate(rows, history, budget).n, np.int64)


def oracle_allocation(task: str, sigma2: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """n_i ∝ sigma_i by Alg. 1's water-fill within the `dynamo` method's bounds."""
    from dynamo_jax.allocation.water_level import water_fill

    acfg = tiny_config(task, "dynamo", 0).allocation
    sigma = np.sqrt(np.maximum(sigma2, 0.0))
    return water_fill(sigma, rows, rows.size * acfg.n_avg, acfg.g_min, acfg.g_max)


def draw_gradients(pipe, rows, n, draws, n_avg, seed_parts) -> np.ndarray:
    """float32 [draws, P]: the gradient of `draws` independent batches of n[i] rollouts."""
    grads = []
    for chunk in range(math.ceil(draws / DRAWS_PER_CALL)):
        k = min(DRAWS_PER_CALL, draws - chunk * DRAWS_PER_CALL)
        pool = pipe.sample(rows, n * k, stream_seed(*seed_parts, chunk))
        for d in range(k):
            completions = [
                c for row, m in zip(rows, n) for c in pool[int(row)][d * m : (d + 1) * m]
            ]
            grads.append(pipe.gradient(completions, rows.size, n_avg)[0].astype(np.float32))
    return np.stack(grads)


def sigma_squared(pipe, rows, n_avg, draws, seed_parts) -> tuple[np.ndarray, list[np.ndarray]]:
    """sigma_i^2 = n_avg E||h_i - E h_i||^2, h_i the gradient of prompt i's n_avg rollouts alone;
    and per prompt the Gram matrix of its `draws` h_i (for bootstrap intervals)."""
    out, grams = np.zeros(rows.size), []
    for i, row in enumerate(rows):
        pool = pipe.sample(
            np.asarray([row]), np.asarray([n_avg * draws]), stream_seed(*seed_parts, i)
        )
        h = np.stack(
            [
                pipe.gradient(pool[int(row)][d * n_avg : (d + 1) * n_avg], 1, n_avg)[0]
                for d in range(draws)
            ]
        )
        grams.append(h @ h.T)
        out[i] = n_avg * total_variance(grams[-1])
    return out, grams


def predicted_ratio_interval(m: dict, n: np.ndarray, resamples: int, rng) -> tuple[float, float]:
    """95% bootstrap interval of Appendix C's predicted ratio for allocation n (sigma_i's draws
    resampled within each prompt)."""
    boot = np.stack([m["n_avg"] * bootstrap_variances(g, resamples, rng) for g in m["sigma_grams"]])
    ratios = np.sum(boot / n[:, None], 0) / (np.sum(boot, 0) / m["n_avg"])
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def reference(pipe: Pipeline, rows, batches: int, per_prompt: int, seed_parts) -> dict:
    """The reference gradient (mean of large uniform batches), its noise Var(g_ref), and p_i
    and H_i (mean token entropy) from the same rollouts."""
    grads, correct, count, entropy = [], 0.0, 0.0, 0.0
    for r in range(batches):
        pool = pipe.sample(rows, np.full(rows.size, per_prompt), stream_seed(*seed_parts, r))
        completions = [c for row in rows for c in pool[int(row)]]
        grad, groups = pipe.gradient(completions, rows.size, per_prompt)
        grads.append(grad)
        correct = correct + pipe.by_row(groups, rows, "correct")
        count = count + pipe.by_row(groups, rows, "count")
        entropy = entropy + pipe.by_row(groups, rows, "entropy_mean") / batches
    ref = np.stack(grads)
    return {
        "g_ref": ref.mean(0),
        "ref_noise": total_variance(ref @ ref.T) / batches,
        "p": correct / count,
        "entropy": entropy,
    }


def measure_stage(args, pipe: Pipeline, task: str, task_index: int, stage: int) -> dict:
    """Everything the tables print for the policy `pipe` holds."""
    cfg, t0 = pipe.cfg, time.perf_counter()
    rows = np.asarray(next(pipe.task.iterator(cfg.data.seed, cfg.train.prompts_per_step)).indices)
    n_avg, base = cfg.allocation.n_avg, (args.seed, task_index, stage)
    rounds = warmup_rounds(pipe, rows, args.warmup, base)
    allocations = {
        a: allocation_of(a, task, rounds, rows, pipe.task.num_prompts)
        if a != "oracle_sigma"
        else None
        for a in args.allocations
    }
    ref = reference(pipe, rows, args.reference, args.reference_n, (*base, REFERENCE))
    sigma2, sigma_grams = sigma_squared(pipe, rows, n_avg, args.sigma_draws, (*base, SIGMA))
    if "oracle_sigma" in allocations:
        allocations["oracle_sigma"] = oracle_allocation(task, sigma2, rows)
    stats: dict[tuple, DrawStats] = {}
    for idx, (name, n) in enumerate(allocations.items()):
        if tuple(n) in stats:  # the same estimator as an allocation already measured
            continue
        grads = draw_gradients(pipe, rows, n, args.draws, n_avg, (*base, DRAWS, idx))
        stats[tuple(n)] = DrawStats.of(grads, ref["g_ref"])
        print(
            f"  {task} step {stage} {name}: n = {n.tolist()}, variance "
            f"{stats[tuple(n)].variance:.4e} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    warm = {k: sum(g[k] for g in rounds) for k in ("correct", "count")}
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


# ----------------------------------------------------------------------------- tables


def spearman(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    from scipy.stats import spearmanr

    res = spearmanr(x, y)
    return float(res.statistic), float(res.pvalue)


def variance_table(m: dict, resamples: int, rng: np.random.Generator) -> list[str]:
    sigma2, n_avg = m["sigma2"], m["n_avg"]
    sigma = np.sqrt(np.maximum(sigma2, 0))
    base = m["stats"][tuple(m["allocations"]["uniform"])]
    base_boot = bootstrap_variances(base.gram, resamples, rng)
    n_prompts = sigma.size
    predicted_uniform = sigma2.sum() / (n_prompts**2 * n_avg)
    lines = [
        f"task `{m['task']}`, GRPO step {m['stage']} (mean p {m['p'].mean():.2f}, "
        f"{int(np.sum(m['p'] == 0))} of {n_prompts} prompts never solved in the reference "
        f"sample): uniform variance {base.variance:.3e}, predicted from sigma_i "
        f"{predicted_uniform:.3e}; ||g_ref||^2 {m['g_ref'] @ m['g_ref']:.3e}; "
        f"Appendix-C optimum (sum sigma)^2/(N sum sigma^2) = {appendix_c_optimum(sigma):.3f}",
        "",
        "| allocation | n_i (min-max) | variance / uniform [95% CI] | App. C model [95% CI] | "
        "token-mean model | E cos^2(g, g_ref) | bias^2 / ||g_ref||^2 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, n in m["allocations"].items():
        s = m["stats"][tuple(n)]
        boot = bootstrap_variances(s.gram, resamples, rng)
        ok = base_boot > 0  # a resample of one repeated draw has no spread (tiny --draws only)
        lo, hi = np.percentile(boot[ok] / base_boot[ok], [2.5, 97.5])
        first = next(a for a, o in m["allocations"].items() if np.array_equal(o, n))
        note = f" (same n as {first})" if first != name else ""
        p_lo, p_hi = predicted_ratio_interval(m, n, resamples, rng)
        lines.append(
            f"| {name}{note} | {n.min()}-{n.max()} | {s.variance / base.variance:.3f} "
            f"[{lo:.3f}, {hi:.3f}] | {prompt_mean_ratio(sigma2, n, n_avg):.3f} "
            f"[{p_lo:.3f}, {p_hi:.3f}] | "
            f"{token_mean_ratio(sigma2, n, n_avg):.3f} | {s.mean_cos2(m['g_ref']):.3f} | "
            f"{s.relative_bias2(m['g_ref'], m['ref_noise']):+.3f} |"
        )
    return lines


def correlation_row(m: dict) -> str:
    p, h, sigma2, n_avg = m["p"], m["entropy"], m["sigma2"], m["n_avg"]
    bern = p * (1 - p)
    f2 = 1.0 - np.exp(-h)
    cells = []
    for x in (bern, bern * f2, mixed_group_probability(p, n_avg)):
        rho, pval = spearman(x, sigma2)
        cells.append(f"{rho:+.2f} (p={pval:.3f})")
    return f"| `{m['task']}` | {m['stage']} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="max,mixed")
    parser.add_argument("--stages", default="0,40,100", help="GRPO steps of the measured policies")
    parser.add_argument("--allocations", default=",".join(ALLOCATIONS))
    parser.add_argument("--draws", type=int, default=200, help="batches per allocation")
    parser.add_argument(
        "--sigma_draws", type=int, default=64, help="batches per prompt for sigma_i"
    )
    parser.add_argument("--warmup", type=int, default=64, help="history rollouts per prompt")
    parser.add_argument("--reference", type=int, default=4, help="batches of the reference")
    parser.add_argument("--reference_n", type=int, default=64, help="their rollouts per prompt")
    parser.add_argument("--loss_method", default="grpo", help="configs/tiny.py method of the loss")
    parser.add_argument(
        "--loss_agg_mode",
        default="",
        choices=("", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "prompt-mean"),
        help="the loss's aggregation (default: the loss method's own)",
    )
    parser.add_argument("--policy_seed", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of the measurement")
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--workdir", default="", help="where the GRPO policies are trained/kept")
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    args.allocations = [a for a in args.allocations.split(",") if a]
    unknown = sorted(set(args.allocations) - set(ALLOCATIONS))
    if unknown or "uniform" not in args.allocations:
        parser.error(
            f"--allocations: need uniform, and names from {list(ALLOCATIONS)}; got {unknown}"
        )
    if args.draws < 2 or args.sigma_draws < 2 or args.reference < 2:
        parser.error("--draws, --sigma_draws and --reference must be >= 2 (variances)")
    if args.warmup % WARMUP_ROUNDS:
        parser.error(f"--warmup must be a multiple of {WARMUP_ROUNDS}")
    stages = [int(s) for s in args.stages.split(",")]
    revision = source_revision()
    print(header(f"gradient_variance {' '.join(sys.argv[1:]) or '(defaults)'}"), flush=True)

    from configs import tiny

    measured = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.workdir or tmp)
        for task in args.tasks.split(","):
            task_index = tiny.TASKS.index(task)
            policies = [policy_params(task, s, stages, args.policy_seed, workdir) for s in stages]
            cfg = with_loss_agg_mode(
                tiny_config(task, args.loss_method, args.policy_seed), args.loss_agg_mode
            )
            pipe = Pipeline(cfg, policies[0], str(workdir))
            try:
                for stage, params in zip(stages, policies):
                    pipe.set_params(params)
                    measured.append(measure_stage(args, pipe, task, task_index, stage))
                    print(f"{task} step {stage}: {measured[-1]['seconds']:.0f} s", flush=True)
            finally:
                pipe.close()

    rng = np.random.default_rng(args.seed)
    print(
        f"\n## Gradient variance at equal budget ({revision}; {args.draws} draws per allocation, "
        f"sigma_i from {args.sigma_draws} single-prompt batches, history from {args.warmup} "
        f"rollouts per prompt, reference {args.reference} x {args.reference_n} per prompt, "
        f"loss of configs/tiny.py:method={args.loss_method}, "
        f"loss_agg_mode {args.loss_agg_mode or 'of the method'})\n"
    )
    for m in measured:
        print("\n".join(variance_table(m, args.bootstrap, rng)) + "\n")
    print("Spearman rank correlation with the measured sigma_i^2 over the batch's prompts:\n")
    print("| task | GRPO step | p(1-p) | p(1-p) f(H)^2 | P(mixed group of n_avg) |")
    print("|---|---|---|---|---|")
    for m in measured:
        print(correlation_row(m))


if __name__ == "__main__":
    main()
