"""Does the rollout allocation lower the variance of the real policy-gradient estimate?

    python -m benchmarks.gradient_variance [--tasks max,mixed] [--stages 0,40,100] [--draws 200]
    python -m benchmarks.gradient_variance --tasks mixed --stages 100 --draws 400 --workdir W
    python -m benchmarks.gradient_variance --config configs/smollm2_arith.py:pool=64 --policy W

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
into `--workdir` (reused when it already holds them). Before measuring it prints how many
gradients it will compute, and after the second its estimated wall time.

A real model's checkpoint (`--config FILE[:ARGS] --policy W [--step K]`): the policy is W's
checkpoint (its latest, or step K), restored by the project's checkpoint code
(export.restore_params: orbax, checksums verified); the batch is the config's own first batch
of prompts_per_step prompts at its budget prompts_per_step x n_avg; each allocation's section is
the config file's with method=<its method> (dynamo: `FILE:ARGS,method=dynamo`); the loss is the
config's own, under each `--loss_agg_mode` of a comma list (token-mean,prompt-mean by default),
every mode on the same rollouts (the same seeds). `--reference 0` leaves the reference out
(p_i and H_i are then the warm-up's; no cosine or bias columns). With the config's
train.skip_on_policy_logprob_pass (the one update takes stop_gradient of its own forward), the
draws and sigma_i's batches run no log-prob pass, as the training loop runs none.
launch.py's `--config.KEY=VALUE` overrides apply to every section read from the file:
`--config.train.share_prompts=True --config.train.packing=False` runs each prompt once in the
update (the same gradients up to float32 rounding, at a fraction of the cost). Rollouts are
sampled at the config's temperature (0.7 for configs/smollm2_arith.py). Give the overrides the
run was launched with that change its data (data.seed, ...), so that the batch is the run's.
On SmolLM2 it needs a learning run's memory (11 GB resident measured): run it on its own.

    python -m benchmarks.gradient_variance --config configs/smollm2_arith.py:pool=64 \
        --policy W --allocations uniform,dynamo,oracle_sigma --draws 32 --sigma_draws 8 \
        --reference 0 --warmup 16 --config.train.share_prompts=True --config.train.packing=False
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.gradient_variance_measure import ALLOCATIONS, WARMUP_ROUNDS, measure_stage
from benchmarks.gradient_variance_pipeline import Pipeline
from benchmarks.gradient_variance_stats import (
    appendix_c_optimum,
    bootstrap_variances,
    mixed_group_probability,
    predicted_ratio_interval,
    prompt_mean_ratio,
    spearman,
    token_mean_ratio,
)
from benchmarks.harness import header, source_revision

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "prompt-mean")
REAL_MODES = "token-mean,prompt-mean"  # the real-model mode's default --loss_agg_mode


# ----------------------------------------------------------------------------- the policies


def quiet(config) -> None:
    """No progress bar, TensorBoard, plots or evaluation: the benchmark reads none of them."""
    config.logging.progress_bar = False
    config.logging.tensorboard = False
    config.logging.plots_at_end = False
    config.eval.every_steps = 0


def tiny_config(task: str, method: str, seed: int):
    from configs import tiny
    from dynamo_jax.config import from_config_dict

    config = tiny.get_config(f"method={method},task={task}")
    config.train.seed = seed
    quiet(config)
    return from_config_dict(config)


@functools.cache
def config_file(spec: str, method: str | None = None, overrides: tuple = ()):
    """The RunConfig of `FILE.py[:ARGS]` (the file's get_config(ARGS), as launch.py's --config),
    with `method=<method>` added to ARGS (replacing one there) when given, and `overrides`
    ((dotted key, text) pairs: launch.py's --config.KEY=VALUE) set on its ConfigDict."""
    import importlib.util

    from dynamo_jax.config import from_config_dict

    path, _, arg = spec.partition(":")
    if method is not None:
        kept = [p for p in arg.split(",") if p and not p.startswith("method=")]
        arg = ",".join([*kept, f"method={method}"])
    loader = importlib.util.spec_from_file_location(f"gradient_variance_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    config = module.get_config(arg or None)
    quiet(config)
    for key, text in overrides:
        set_override(config, key, text)
    return from_config_dict(config)


def set_override(config, key: str, text: str) -> None:
    """config.<key> = text read as the field's type (bool true/false, int, float, str; a tuple
    or None field as a Python literal); ConfigError naming the flag if it is not a field."""
    import ast

    from dynamo_jax.errors import ConfigError

    *parents, leaf = key.split(".")
    try:
        node = config
        for name in parents:
            node = node[name]
        current = node[leaf]
        if isinstance(current, bool):
            value = {"true": True, "false": False}[text.lower()]
        elif isinstance(current, (int, float, str)):
            value = type(current)(text)
        else:
            value = ast.literal_eval(text)
        node[leaf] = value
    except (KeyError, AttributeError, ValueError, SyntaxError, TypeError) as err:
        raise ConfigError(f"--config.{key}={text}: {err!r}") from err


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


def checkpoint_policy(cfg, workdir: Path, step: int | None):
    """(step, params) of the run in `workdir` (its latest checkpoint, or `step`), restored by the
    project's checkpoint code; a run of another model than `cfg`'s is refused (ConfigError)."""
    from dynamo_jax.config import from_config_dict
    from dynamo_jax.errors import ConfigError
    from dynamo_jax.export import restore_params

    saved = workdir / "config.json"
    if saved.is_file():
        run_model = from_config_dict(json.loads(saved.read_text())).model
        if run_model != cfg.model:
            raise ConfigError(f"--policy {workdir}: its run's model is not --config's model")
    return restore_params(workdir, cfg, step)


def with_loss_agg_mode(cfg, mode: str):
    """`cfg` with its loss aggregated by `mode` ('' keeps it); seq-mean-token-sum-norm divides by
    the response length limit (Dr.GRPO's constant)."""
    if not mode:
        return cfg
    extra = (
        {"max_len_norm": cfg.rollout.max_new_tokens} if mode == "seq-mean-token-sum-norm" else {}
    )
    return dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, loss_agg_mode=mode, **extra))


def measure_tiny(args, stages: list[int]) -> list[dict]:
    """configs/tiny.py's GRPO policies at `stages`, per task."""
    from configs import tiny

    measured = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.workdir or tmp)
        for task in args.tasks.split(","):
            task_index = tiny.TASKS.index(task)
            policies = [policy_params(task, s, stages, args.policy_seed, workdir) for s in stages]
            cfg = with_loss_agg_mode(
                tiny_config(task, args.loss_method, args.policy_seed), args.loss_agg_mode[0]
            )
            pipe = Pipeline(cfg, policies[0], str(workdir))
            config_of = functools.partial(tiny_config, task, seed=0)
            try:
                for stage, params in zip(stages, policies):
                    pipe.set_params(params)
                    m = measure_stage(args, pipe, config_of, task, task_index, stage)
                    m["title"] = f"task `{task}`, GRPO step {stage}"
                    measured.append(m)
                    print(f"{task} step {stage}: {m['seconds']:.0f} s", flush=True)
            finally:
                pipe.close()
    return measured


def measure_checkpoint(args) -> list[dict]:
    """`--config`'s model at `--policy`'s checkpoint, under each loss_agg_mode (the same seeds,
    so the same rollouts: the modes differ only in the loss's gradient)."""
    from dynamo_jax.models.fetch import resolve_init

    cfg = resolve_init(config_file(args.config, None, args.overrides))  # the tokenizer made local
    step, params = checkpoint_policy(cfg, Path(args.policy), args.step)
    print(f"policy: {args.policy} at step {step}", flush=True)
    config_of = functools.partial(config_file, args.config, overrides=args.overrides)
    measured = []
    with tempfile.TemporaryDirectory() as tmp:
        pipe = Pipeline(cfg, params, tmp, engine_batch=cfg.jax_engine.max_batch)
        try:
            for mode in args.loss_agg_mode:
                pipe.set_config(with_loss_agg_mode(cfg, mode))
                m = measure_stage(args, pipe, config_of, mode or "the config's", 0, step)
                m["title"] = f"`{args.config}` at step {step} of `{args.policy}`, {mode or '-'}"
                measured.append(m)
                print(f"{mode} at step {step}: {m['seconds']:.0f} s", flush=True)
        finally:
            pipe.close()
    return measured


# ----------------------------------------------------------------------------- tables


def variance_table(m: dict, resamples: int, rng: np.random.Generator) -> list[str]:
    sigma2, n_avg, g_ref = m["sigma2"], m["n_avg"], m["g_ref"]
    sigma = np.sqrt(np.maximum(sigma2, 0))
    base = m["stats"][tuple(m["allocations"]["uniform"])]
    base_boot = bootstrap_variances(base.gram, resamples, rng)
    n_prompts = sigma.size
    predicted_uniform = sigma2.sum() / (n_prompts**2 * n_avg)
    sample = "warm-up" if g_ref is None else "reference"
    ref_norm = "" if g_ref is None else f"; ||g_ref||^2 {g_ref @ g_ref:.3e}"
    lines = [
        f"{m['title']} (mean p {m['p'].mean():.2f}, "
        f"{int(np.sum(m['p'] == 0))} of {n_prompts} prompts never solved in the {sample} "
        f"sample): uniform variance {base.variance:.3e}, predicted from sigma_i "
        f"{predicted_uniform:.3e}{ref_norm}; "
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
        if g_ref is None:
            against_ref = "n/a | n/a"
        else:
            against_ref = (
                f"{s.mean_cos2(g_ref):.3f} | {s.relative_bias2(g_ref, m['ref_noise']):+.3f}"
            )
        lines.append(
            f"| {name}{note} | {n.min()}-{n.max()} | {s.variance / base.variance:.3f} "
            f"[{lo:.3f}, {hi:.3f}] | {prompt_mean_ratio(sigma2, n, n_avg):.3f} "
            f"[{p_lo:.3f}, {p_hi:.3f}] | "
            f"{token_mean_ratio(sigma2, n, n_avg):.3f} | {against_ref} |"
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


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="max,mixed")
    parser.add_argument("--stages", default="0,40,100", help="GRPO steps of the measured policies")
    parser.add_argument(
        "--config", default="", help="a config FILE[:ARGS] (with --policy; --config.KEY=VALUE)"
    )
    parser.add_argument("--policy", default="", help="a workdir of --config's run")
    parser.add_argument("--step", type=int, default=None, help="its checkpoint (default latest)")
    parser.add_argument("--allocations", default=",".join(ALLOCATIONS))
    parser.add_argument("--draws", type=int, default=200, help="batches per allocation")
    parser.add_argument(
        "--sigma_draws", type=int, default=64, help="batches per prompt for sigma_i"
    )
    parser.add_argument("--warmup", type=int, default=64, help="history rollouts per prompt")
    parser.add_argument(
        "--reference", type=int, default=4, help="batches of the reference (0: none)"
    )
    parser.add_argument("--reference_n", type=int, default=64, help="their rollouts per prompt")
    parser.add_argument("--loss_method", default="grpo", help="configs/tiny.py method of the loss")
    parser.add_argument(
        "--loss_agg_mode",
        default=None,
        help=f"the loss's aggregation, one of {', '.join(LOSS_AGG_MODES)} (default: the loss "
        f"method's own); with --config a comma list (default {REAL_MODES})",
    )
    parser.add_argument("--policy_seed", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of the measurement")
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--workdir", default="", help="where the GRPO policies are trained/kept")
    args, rest = parser.parse_known_args(argv)
    overrides = [re.fullmatch(r"--config\.([\w.]+)=(.*)", a) for a in rest]
    if not all(overrides):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.overrides = tuple(m.groups() for m in overrides)

    args.allocations = [a for a in args.allocations.split(",") if a]
    unknown = sorted(set(args.allocations) - set(ALLOCATIONS))
    if unknown or "uniform" not in args.allocations:
        parser.error(
            f"--allocations: need uniform, and names from {list(ALLOCATIONS)}; got {unknown}"
        )
    if args.draws < 2 or args.sigma_draws < 2 or args.reference == 1 or args.reference < 0:
        parser.error("--draws, --sigma_draws must be >= 2, --reference 0 or >= 2 (variances)")
    if args.warmup % WARMUP_ROUNDS or args.warmup < 2 * WARMUP_ROUNDS:
        parser.error(f"--warmup must be a multiple of {WARMUP_ROUNDS}, at least 2 per round")
    if bool(args.config) != bool(args.policy) or (args.step is not None and not args.policy):
        parser.error("--config and --policy go together (and --step with them)")
    if args.config and not Path(args.config.partition(":")[0]).is_file():
        parser.error(f"--config: no such file: {args.config.partition(':')[0]}")
    if args.overrides and not args.config:
        parser.error("--config.KEY=VALUE needs --config")
    if args.overrides:
        from dynamo_jax.errors import ConfigError

        try:
            config_file(args.config, None, args.overrides)
        except ConfigError as err:
            parser.error(str(err))
    modes = args.loss_agg_mode
    if modes is None:
        modes = REAL_MODES if args.config else ""
    args.loss_agg_mode = modes.split(",") if modes else [""]
    bad = sorted(set(args.loss_agg_mode) - {"", *LOSS_AGG_MODES})
    if bad or (not args.config and len(args.loss_agg_mode) > 1):
        parser.error(f"--loss_agg_mode: one of {LOSS_AGG_MODES} (a list with --config); got {bad}")
    return args


def main(argv=None) -> list[dict]:
    """Measures, prints the tables, and returns the measurements (one dict per policy and
    loss_agg_mode: `measure_stage`'s, with its table title)."""
    args = parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    revision = source_revision()
    shown = " ".join(sys.argv[1:] if argv is None else argv) or "(defaults)"
    print(header(f"gradient_variance {shown}"), flush=True)
    if args.config:
        measured = measure_checkpoint(args)
        policy = f"loss of {args.config}, loss_agg_mode {','.join(args.loss_agg_mode)}"
        columns = "| loss_agg_mode | checkpoint step |"
    else:
        measured = measure_tiny(args, [int(s) for s in args.stages.split(",")])
        policy = (
            f"loss of configs/tiny.py:method={args.loss_method}, "
            f"loss_agg_mode {args.loss_agg_mode[0] or 'of the method'}"
        )
        columns = "| task | GRPO step |"

    rng = np.random.default_rng(args.seed)
    print(
        f"\n## Gradient variance at equal budget ({revision}; {args.draws} draws per allocation, "
        f"sigma_i from {args.sigma_draws} single-prompt batches, history from {args.warmup} "
        f"rollouts per prompt, reference {args.reference} x {args.reference_n} per prompt, "
        f"{policy})\n"
    )
    for m in measured:
        print("\n".join(variance_table(m, args.bootstrap, rng)) + "\n")
    print("Spearman rank correlation with the measured sigma_i^2 over the batch's prompts:\n")
    print(f"{columns} p(1-p) | p(1-p) f(H)^2 | P(mixed group of n_avg) |")
    print("|---|---|---|---|---|")
    for m in measured:
        print(correlation_row(m))
    return measured


if __name__ == "__main__":
    main()
