"""pass@k evaluation: sample n completions per problem, score them, report per benchmark.

    python -m dynamo_jax.evaluate --config configs/tiny.py --checkpoint CKPT --output eval.json

`evaluate` works with any `RolloutEngine` and any scorer with `score(texts, golds)` (the
math-verify `RewardPool`, the synthetic task's `SyntheticScorer`). pass@k is the unbiased
estimator of Chen et al. (2021), docs/algorithm.md#evaluation:

    pass@k = 1 − C(n−c, k) / C(n, k) = 1 − Π_{i=n−c+1}^{n} (1 − k/i)     (1 when n − c < k)

computed as that product, which never forms the huge binomials. It is averaged over problems
per benchmark (`source`) and over all problems ("overall", so large benchmarks weigh more).
Reported k are the requested ones that do not exceed n (default {1, 8, 32}).
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from dynamo_jax import tasks
from dynamo_jax.config import RunConfig
from dynamo_jax.data.rows import Row
from dynamo_jax.engine_factory import build_engine
from dynamo_jax.export import restore_params
from dynamo_jax.models.hf_io import load_hf_checkpoint
from dynamo_jax.models.tokenizer import stop_token_ids
from dynamo_jax.rewards.verdict import STATUSES, Verdict
from dynamo_jax.rollout.protocol import Completion, Request, RolloutEngine, SamplingParams
from dynamo_jax.seeds import EVAL, step_seed
from dynamo_jax.tasks import Task

DEFAULT_KS = (1, 8, 32)
OVERALL = "overall"
GREEDY = "eval_greedy"  # metrics prefix of the greedy evaluation (eval.greedy)


class Scorer(Protocol):
    def score(
        self, completions_text: Sequence[str], golds: Sequence[str], sources=None, extra_infos=None
    ) -> list[Verdict]: ...


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with c correct out of n samples (stable product form)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


@dataclasses.dataclass(frozen=True)
class ProblemResult:
    """One problem's samples: how many were correct, had no answer, and their mean length."""

    prompt_id: int
    source: str
    num_samples: int
    num_correct: int
    num_no_answer: int
    mean_response_tokens: float
    status_counts: dict[str, int]


@dataclasses.dataclass(frozen=True)
class GroupStats:
    """Aggregates over a set of problems (one benchmark, or all of them)."""

    num_problems: int
    pass_at: dict[int, float]
    mean_response_tokens: float
    no_answer_share: float
    status_shares: dict[str, float]


@dataclasses.dataclass(frozen=True)
class EvalReport:
    n_samples: int
    ks: tuple[int, ...]
    groups: dict[str, GroupStats]  # every source, then "overall"
    problems: tuple[ProblemResult, ...]


def reported_ks(requested: Sequence[int], n_samples: int) -> tuple[int, ...]:
    ks = tuple(sorted({int(k) for k in requested if 1 <= int(k) <= n_samples}))
    if not ks:
        raise ValueError(f"no k in {tuple(requested)} is within 1..n_samples={n_samples}")
    return ks


def summarize(problems: Sequence[ProblemResult], ks: Sequence[int]) -> GroupStats:
    """pass@k averaged over problems; lengths and statuses averaged over all samples."""
    samples = sum(p.num_samples for p in problems)
    counts = collections.Counter()
    for p in problems:
        counts.update(p.status_counts)
    return GroupStats(
        num_problems=len(problems),
        pass_at={
            k: float(np.mean([pass_at_k(p.num_samples, p.num_correct, k) for p in problems]))
            for k in ks
        },
        mean_response_tokens=sum(p.mean_response_tokens * p.num_samples for p in problems)
        / samples,
        no_answer_share=sum(p.num_no_answer for p in problems) / samples,
        status_shares={s: counts[s] / samples for s in STATUSES},
    )


def _problem_result(
    row: Row, completions: Sequence[Completion], verdicts: Sequence[Verdict]
) -> ProblemResult:
    statuses = collections.Counter(v.status for v in verdicts)
    return ProblemResult(
        prompt_id=row.prompt_id,
        source=row.source,
        num_samples=len(verdicts),
        num_correct=statuses["correct"],
        num_no_answer=statuses["no_answer"],
        mean_response_tokens=float(np.mean([len(c.token_ids) for c in completions])),
        status_counts={s: statuses[s] for s in STATUSES},
    )


def _check_grouping(completions: Sequence[Completion], requests: Sequence[Request]) -> None:
    """The protocol promises request order then sample order; a broken engine must not skew pass@k."""
    expected = [(r.prompt_id, i) for r in requests for i in range(r.n)]
    got = [(int(c.prompt_id), int(c.sample_index)) for c in completions]
    if got != expected:
        raise RuntimeError(
            f"engine returned {len(got)} completions not grouped as requested ({len(expected)} "
            "expected, by request then sample_index)"
        )


def evaluate(
    engine: RolloutEngine,
    rows: Sequence[Row],
    prompt_token_ids: Sequence[Sequence[int]],
    *,
    scorer: Scorer,
    decode: Callable[[np.ndarray], str],
    sampling: SamplingParams,
    n_samples: int,
    ks: Sequence[int] = DEFAULT_KS,
    chunk_prompts: int = 64,
) -> EvalReport:
    """Sample `n_samples` completions per row, score them against the row's gold, aggregate.

    Problems are sent `chunk_prompts` at a time so an engine never holds every sample at once.
    """
    if len(rows) != len(prompt_token_ids) or not rows:
        raise ValueError(
            f"evaluate: {len(rows)} rows and {len(prompt_token_ids)} prompts (need equal, > 0)"
        )
    if n_samples < 1 or chunk_prompts < 1:
        raise ValueError(
            f"evaluate: n_samples={n_samples} and chunk_prompts={chunk_prompts} must be >= 1"
        )
    ks = reported_ks(ks, n_samples)
    results: list[ProblemResult] = []
    for start in range(0, len(rows), chunk_prompts):
        chunk = list(zip(rows, prompt_token_ids))[start : start + chunk_prompts]
        requests = [Request(row.prompt_id, tuple(ids), n_samples) for row, ids in chunk]
        completions = engine.generate(requests, sampling)
        _check_grouping(completions, requests)
        texts = [decode(c.token_ids) for c in completions]
        golds = [row.gold for row, _ in chunk for _ in range(n_samples)]
        sources = [row.source for row, _ in chunk for _ in range(n_samples)]
        extra_infos = [{"prompt_id": row.prompt_id} for row, _ in chunk for _ in range(n_samples)]
        verdicts = scorer.score(texts, golds, sources=sources, extra_infos=extra_infos)
        for j, (row, _) in enumerate(chunk):
            part = slice(j * n_samples, (j + 1) * n_samples)
            results.append(_problem_result(row, completions[part], verdicts[part]))
    by_source: dict[str, list[ProblemResult]] = collections.defaultdict(list)
    for result in results:
        by_source[result.source].append(result)
    groups = {source: summarize(by_source[source], ks) for source in sorted(by_source)}
    groups[OVERALL] = summarize(results, ks)
    return EvalReport(n_samples, ks, groups, tuple(results))


def report_to_json(report: EvalReport) -> dict[str, Any]:
    """Plain JSON: settings, per-group aggregates (pass@k keyed "pass@k"), per-problem counts."""

    def group(stats: GroupStats) -> dict[str, Any]:
        out = dataclasses.asdict(stats)
        out["pass_at"] = {f"pass@{k}": v for k, v in stats.pass_at.items()}
        return out

    return {
        "n_samples": report.n_samples,
        "ks": list(report.ks),
        "groups": {name: group(stats) for name, stats in report.groups.items()},
        "problems": [dataclasses.asdict(p) for p in report.problems],
    }


def write_report(report: EvalReport, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report_to_json(report), indent=2) + "\n")


def format_table(report: EvalReport) -> str:
    """A fixed-width table: one line per benchmark and one for all problems (pass@k in %)."""
    headers = (
        ["benchmark", "problems"] + [f"pass@{k}" for k in report.ks] + ["mean len", "no answer"]
    )
    lines = []
    for name, stats in report.groups.items():
        cells = [name, str(stats.num_problems)]
        cells += [f"{100 * stats.pass_at[k]:.1f}" for k in report.ks]
        cells += [f"{stats.mean_response_tokens:.1f}", f"{100 * stats.no_answer_share:.1f}%"]
        lines.append(cells)
    widths = [max(len(row[i]) for row in [headers] + lines) for i in range(len(headers))]

    def fmt(cells):
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )

    rule = "-" * len(fmt(headers))
    body = [fmt(c) for c in lines[:-1]] + [rule, fmt(lines[-1])]
    return "\n".join([fmt(headers), rule, *body])


def metrics(report: EvalReport, prefix: str = "eval") -> dict[str, float]:
    """Flat scalars for a metrics writer: `{prefix}/{group}/pass@k`, lengths, no-answer share."""
    out: dict[str, float] = {}
    for name, stats in report.groups.items():
        for k, value in stats.pass_at.items():
            out[f"{prefix}/{name}/pass@{k}"] = value
        out[f"{prefix}/{name}/mean_response_tokens"] = stats.mean_response_tokens
        out[f"{prefix}/{name}/no_answer_share"] = stats.no_answer_share
    return out


# --- command line -------------------------------------------------------------------------------


def make_engine(run_config: RunConfig, checkpoint: str) -> RolloutEngine:
    """The rollout engine holding a checkpoint's weights, on the engine the run's config names:
    a run directory (its latest orbax step) or a Hugging Face directory (config.json +
    safetensors). Single device, no mesh: evaluating needs no sharded training state."""
    path = Path(checkpoint)
    if (path / "config.json").is_file() and (path / "checkpoints").is_dir():
        _, params = restore_params(path, run_config, None)
    else:
        _, params = load_hf_checkpoint(path, cfg=run_config.model)
    if run_config.rollout.engine == "vllm" and not run_config.init.checkpoint:
        raise ValueError("evaluating with the vLLM engine needs init.checkpoint")
    return build_engine(run_config, params, None, None, path)


def evaluate_in_loop(engine: RolloutEngine, task: Task, cfg: RunConfig, step: int) -> dict:
    """pass@k on the task's evaluation problems with the live engine (temperature 1, top-p 1),
    as flat metrics (`eval/<benchmark>/pass@k`, `eval/pass@1` overall)."""
    limit = cfg.eval.max_problems or len(task.eval_rows)
    rows, prompts = task.eval_rows[:limit], task.eval_prompt_tokens[:limit]
    if not rows:
        return {}
    sampling = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        stop_token_ids=task.stop_token_ids,
        seed=step_seed(cfg.train.seed, step, EVAL),
    )

    def run(params: SamplingParams, n_samples: int, ks) -> EvalReport:
        return evaluate(
            engine, rows, prompts, scorer=task.scorer, decode=task.decode,
            sampling=params, n_samples=n_samples, ks=ks,
        )  # fmt: skip

    out = metrics(run(sampling, cfg.eval.n_samples, cfg.eval.ks))
    out["eval/pass@1"] = out.get(f"eval/{OVERALL}/pass@1", float("nan"))
    if cfg.eval.greedy:  # accuracy of the most likely answer: one sample at T = 0
        greedy = dataclasses.replace(sampling, temperature=0.0)
        out.update(metrics(run(greedy, 1, (1,)), prefix=GREEDY))
    return out


def run_from_config(
    run_config: Any,
    checkpoint: str,
    *,
    output: str,
    n_samples: int,
    ks,
    max_problems: int,
    seed: int,
) -> EvalReport:
    """The CLI's work: problems of the config's data section, the checkpoint's engine, report."""
    tokenizer = tasks.task_tokenizer(run_config, fallback_dir=checkpoint)
    rows, prompt_ids = tasks.eval_problems(run_config, tokenizer, max_problems)
    scorer = tasks.make_scorer(run_config)
    sampling = SamplingParams(
        max_new_tokens=run_config.rollout.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        stop_token_ids=stop_token_ids(tokenizer),
        seed=seed,
    )
    engine = make_engine(run_config, checkpoint)
    try:
        with scorer:
            report = evaluate(
                engine,
                rows,
                prompt_ids,
                scorer=scorer,
                decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
                sampling=sampling,
                n_samples=n_samples,
                ks=ks,
            )
    finally:
        engine.close()
    write_report(report, output)
    return report


def main(argv: Sequence[str]) -> None:
    del argv
    from dynamo_jax.config import from_config_dict
    from dynamo_jax.models.fetch import resolve_checkpoint, resolve_init

    report = run_from_config(
        resolve_init(from_config_dict(_FLAGS["config"].value)),
        resolve_checkpoint(_FLAGS["checkpoint"].value),
        output=_FLAGS["output"].value,
        n_samples=_FLAGS["n_samples"].value,
        ks=[int(k) for k in _FLAGS["ks"].value],
        max_problems=_FLAGS["max_problems"].value,
        seed=_FLAGS["seed"].value,
    )
    print(format_table(report))
    print(f"wrote {_FLAGS['output'].value}")


def _define_flags() -> dict[str, Any]:
    from absl import flags
    from ml_collections import config_flags

    return {
        "config": config_flags.DEFINE_config_file(
            "config", None, "ml_collections config file.", lock_config=True
        ),
        "checkpoint": flags.DEFINE_string("checkpoint", None, "Checkpoint to evaluate."),
        "output": flags.DEFINE_string("output", "eval.json", "Where to write the JSON report."),
        "n_samples": flags.DEFINE_integer("n_samples", 32, "Samples per problem."),
        "ks": flags.DEFINE_list("ks", ["1", "8", "32"], "k values of pass@k (those <= n_samples)."),
        "max_problems": flags.DEFINE_integer(
            "max_problems", 0, "Evaluate the first N problems (0 = all)."
        ),
        "seed": flags.DEFINE_integer("seed", 0, "Sampling seed."),
    }


if __name__ == "__main__":
    from absl import app

    from dynamo_jax import cli

    cli.use_compilation_cache()  # launch.py's cache, set before the flags load the config
    _FLAGS = _define_flags()
    app.run(main)
