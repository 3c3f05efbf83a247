"""What the loop trains on: prompts, how to score completions, the engine and evaluation.

`build_task(cfg)` turns the data/reward sections into a `Task`: tokenized prompts keyed by their
stable ids, the stop/pad ids, the scoring function (math-verify pool for real data, the exact
checker for the synthetic task) and the epoch iterator. `build_engine` makes the configured
rollout engine; `evaluate` runs the pass@k harness on the held-out problems.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from dynamo_jax.evaluate import stop_token_ids
from dynamo_jax.rewards.verdict import STATUSES
from dynamo_jax.rollout.protocol import Completion
from dynamo_jax.sharding import multihost


@dataclasses.dataclass
class Task:
    """Tokenized training prompts and their scorer (row r of every array is dataset row r)."""

    prompt_ids: np.ndarray  # int64 [N] stable ids (survive reshuffling and resume)
    prompt_tokens: list[tuple[int, ...]]  # chat-templated prompt token ids per row
    answers: list[str]  # gold answers per row
    stop_token_ids: tuple[int, ...]
    pad_id: int
    seq_len: int  # max prompt tokens + max new tokens: the trainer's fixed row length
    decode: Callable[[Sequence[int]], str]  # token ids → text (for scoring and eval)
    scorer: Any  # RewardPool-like: .score(texts, golds) -> list[Verdict]
    make_iterator: Callable[[int, int], Any]  # (seed, batch size) → checkpointable EpochIterator
    eval_rows: list = dataclasses.field(default_factory=list)  # data.Row of the eval problems
    eval_prompt_tokens: list = dataclasses.field(default_factory=list)  # their prompt ids

    def __post_init__(self):
        self.tokens_by_id = {int(i): t for i, t in zip(self.prompt_ids, self.prompt_tokens)}
        self._answer_by_id = {int(i): a for i, a in zip(self.prompt_ids, self.answers)}
        if len(self.tokens_by_id) != len(self.prompt_ids):
            raise ValueError("Task: prompt ids are not unique")

    @property
    def num_prompts(self) -> int:
        return len(self.prompt_ids)

    def iterator(self, seed: int, batch_size: int) -> Any:
        return self.make_iterator(seed, batch_size)

    def score(self, completions: Sequence[Completion]) -> tuple[np.ndarray, dict[str, float]]:
        """Rewards float32 [len(completions)] and the share of each verdict status."""
        rewards, codes = self.score_codes(completions)
        return rewards, status_shares(codes)

    def score_codes(self, completions: Sequence[Completion]) -> tuple[np.ndarray, np.ndarray]:
        """Rewards float32 [n] and verdict status codes int32 [n] (indices into STATUSES): plain
        arrays, so processes that each scored a slice can all-gather them."""
        texts = [self.decode(c.token_ids) for c in completions]
        golds = [self._answer_by_id[int(c.prompt_id)] for c in completions]
        verdicts = self.scorer.score(texts, golds)
        rewards = np.asarray([v.reward for v in verdicts], np.float32)
        codes = np.asarray([STATUSES.index(v.status) for v in verdicts], np.int32)
        return rewards, codes

    def close(self) -> None:
        self.scorer.close()


def status_shares(codes: np.ndarray) -> dict[str, float]:
    """The share of each verdict status among status codes (indices into STATUSES)."""
    counts = np.bincount(np.asarray(codes, np.int64), minlength=len(STATUSES))
    total = max(int(counts.sum()), 1)
    return {f"reward/{s}_share": int(counts[i]) / total for i, s in enumerate(STATUSES)}


def score_completions(task: Task, completions: list) -> tuple[np.ndarray, dict]:
    """Rewards and verdict shares of `completions`. With several processes each scores its
    contiguous slice and the results are all-gathered (train.py's module docstring): every
    process gets the same arrays, and the scoring work is split rather than repeated."""
    procs, n = jax.process_count(), len(completions)
    if procs == 1 or n == 0:
        return task.score(completions)
    per = -(-n // procs)
    mine = completions[jax.process_index() * per :][:per]
    rewards_p, codes_p = np.zeros(per, np.float32), np.full(per, -1, np.int32)
    rewards_p[: len(mine)], codes_p[: len(mine)] = task.score_codes(mine)
    rewards = multihost.allgather_host(rewards_p).reshape(-1)[:n]
    codes = multihost.allgather_host(codes_p).reshape(-1)[:n]
    return rewards, status_shares(codes)


QWEN2_TOKENIZER = "qwen2"  # init.tokenizer value: the real Qwen2 vocabulary, built offline


def load_tokenizer(spec: str) -> Any:
    """An HF tokenizer directory, or "qwen2" for the Qwen2/2.5/3 vocabulary built offline."""
    from dynamo_jax.models import tokenizer as tok

    if spec == QWEN2_TOKENIZER:
        return tok.build_qwen2_tokenizer()
    if not spec:
        raise ValueError("data.task='math' needs init.tokenizer (an HF tokenizer dir or 'qwen2')")
    return tok.load_tokenizer(spec)


def _load_rows(cfg: Any) -> tuple[Any, list, list, Any]:
    """(tokenizer, training rows, eval rows, scorer) for the data section's task."""
    from dynamo_jax import data

    d = cfg.data
    if d.task == "synthetic":
        syn = data.SyntheticConfig(
            d.synthetic_op, d.synthetic_modulus, d.synthetic_num_rows, d.seed
        )
        rows = data.make_synthetic_dataset(syn)
        eval_rows = rows  # the task has no held-out split: evaluation re-asks its problems
        return data.synthetic_tokenizer(), rows, eval_rows, data.SyntheticScorer(cfg.reward)
    from dynamo_jax.rewards import RewardPool

    tokenizer = load_tokenizer(cfg.init.tokenizer or cfg.init.checkpoint)
    opts = dict(fmt=d.format, on_bad_row=d.on_bad_row, id_field=d.id_field)
    rows, _ = data.load_files(d.paths, **opts)
    eval_rows = data.load_files(d.eval_paths, **opts)[0] if d.eval_paths else []
    pool = RewardPool(cfg.reward)
    pool.start()
    return tokenizer, rows, eval_rows, pool


def build_task(cfg: Any) -> Task:
    """The run's training prompts, scorer and evaluation problems (see the module docstring)."""
    from dynamo_jax import data

    tokenizer, rows, eval_rows, scorer = _load_rows(cfg)
    prompts = data.build_prompts(rows, tokenizer, cfg.data)
    if len(prompts.rows) < cfg.train.prompts_per_step:
        raise ValueError(
            f"data: {len(prompts.rows)} usable prompts, fewer than train.prompts_per_step "
            f"({cfg.train.prompts_per_step})"
        )
    eval_prompts = data.build_prompts(eval_rows, tokenizer, cfg.data) if eval_rows else None
    if cfg.model.vocab_size < len(tokenizer):
        raise ValueError(
            f"model.vocab_size ({cfg.model.vocab_size}) is smaller than the tokenizer's "
            f"vocabulary ({len(tokenizer)})"
        )
    return Task(
        prompt_ids=np.asarray(prompts.prompt_ids, np.int64),
        prompt_tokens=list(prompts.token_ids),
        answers=[row.gold for row in prompts.rows],
        stop_token_ids=stop_token_ids(tokenizer),
        pad_id=int(tokenizer.pad_token_id or 0),
        seq_len=cfg.max_seq_len,
        decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
        scorer=scorer,
        make_iterator=lambda seed, size: data.EpochIterator(len(prompts.rows), size, seed),
        eval_rows=list(eval_prompts.rows) if eval_prompts else [],
        eval_prompt_tokens=list(eval_prompts.token_ids) if eval_prompts else [],
    )


def evaluate(tr: Any, step: int) -> dict[str, float]:
    """pass@k on the task's evaluation problems with the live engine (temperature 1, top-p 1)."""
    from dynamo_jax import evaluate as harness
    from dynamo_jax.rollout.protocol import SamplingParams
    from dynamo_jax.train import step_seed

    cfg, task = tr.cfg, tr.task
    limit = cfg.eval.max_problems or len(task.eval_rows)
    rows, prompts = task.eval_rows[:limit], task.eval_prompt_tokens[:limit]
    if not rows:
        return {}
    sampling = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        stop_token_ids=task.stop_token_ids,
        seed=step_seed(cfg.train.seed, step, 2),
    )
    report = harness.evaluate(
        tr.engine,
        rows,
        prompts,
        scorer=task.scorer,
        decode=task.decode,
        sampling=sampling,
        n_samples=cfg.eval.n_samples,
        ks=cfg.eval.ks,
    )
    out = harness.metrics(report)
    out["eval/pass@1"] = out.get(f"eval/{harness.OVERALL}/pass@1", float("nan"))
    return out


def engine_for_checkpoint(cfg: Any, checkpoint: str) -> Any:
    """A rollout engine holding a checkpoint's weights: a run directory (its latest orbax step)
    or an HF directory (config.json + safetensors). Used by `python -m dynamo_jax.evaluate`."""
    from pathlib import Path

    path = Path(checkpoint)
    if (path / "config.json").is_file() and (path / "checkpoints").is_dir():
        from dynamo_jax.export import restore_params

        _, params = restore_params(path, cfg, None)
    else:
        from dynamo_jax.models.hf_io import load_hf_checkpoint

        _, params = load_hf_checkpoint(path, cfg=cfg.model)
    if cfg.rollout.engine == "vllm" and not cfg.init.checkpoint:
        raise ValueError("evaluating with the vLLM engine needs init.checkpoint")
    # Single device, no mesh: evaluation of a checkpoint needs no sharded training state.
    from dynamo_jax.rollout.factory import build_engine

    return build_engine(cfg, params, None, None, path)
