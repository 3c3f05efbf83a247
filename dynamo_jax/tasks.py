"""What the loop trains on: the prompts, how completions are scored, and the eval problems.

`build_task(cfg)` turns the data/reward sections into a `Task`: tokenized prompts keyed by their
stable ids, the stop/pad ids, the scoring function (math-verify pool for real data, the exact
checker for the synthetic task), the epoch iterator and the evaluation problems.
`score_completions` scores a step's completions (split over processes). The pieces
(`task_tokenizer`, `make_scorer`, `eval_problems`) also serve `python -m dynamo_jax.evaluate`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from dynamo_jax import data
from dynamo_jax.config import RunConfig
from dynamo_jax.errors import ConfigError, DataError
from dynamo_jax.models.tokenizer import batch_decoder, stop_token_ids, tokenizer_from_spec
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
    decode_many: Callable[[Sequence[Sequence[int]]], list[str]]  # the same, for many (scoring)
    scorer: Any  # RewardPool-like: .score(texts, golds) -> list[Verdict]
    make_iterator: Callable[[int, int], Any]  # (seed, batch size) → checkpointable EpochIterator
    eval_rows: list = dataclasses.field(default_factory=list)  # data.Row of the eval problems
    eval_prompt_tokens: list = dataclasses.field(default_factory=list)  # their prompt ids
    sources: list[str] = dataclasses.field(default_factory=list)  # data_source per row

    def __post_init__(self):
        self.tokens_by_id = {int(i): t for i, t in zip(self.prompt_ids, self.prompt_tokens)}
        self._answer_by_id = {int(i): a for i, a in zip(self.prompt_ids, self.answers)}
        self._source_by_id = {int(i): s for i, s in zip(self.prompt_ids, self.sources)}
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
        texts = self.decode_many([c.token_ids for c in completions])
        golds = [self._answer_by_id[int(c.prompt_id)] for c in completions]
        # data_source and extra_info: what a user's reward.function receives (verl's signature).
        sources = [self._source_by_id.get(int(c.prompt_id)) for c in completions]
        extra_infos = [{"prompt_id": int(c.prompt_id)} for c in completions]
        verdicts = self.scorer.score(texts, golds, sources=sources, extra_infos=extra_infos)
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
    contiguous slice and the results are all-gathered (loop/train.py's module docstring): every
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


def task_tokenizer(cfg: RunConfig, fallback_dir: str = "") -> Any:
    """The tokenizer of the data section's task: the synthetic task's own, or `init.tokenizer`
    (an HF directory or "qwen2"), else `fallback_dir` / `init.checkpoint`'s files."""
    if cfg.data.task == "synthetic":
        return data.synthetic_tokenizer()
    return tokenizer_from_spec(cfg.init.tokenizer or fallback_dir or cfg.init.checkpoint)


def make_scorer(cfg: RunConfig) -> Any:
    """The task's scorer, started: the exact checker (synthetic) or the math-verify pool; a
    user's `reward.function` always runs in the pool, whatever the task."""
    if cfg.data.task == "synthetic" and not cfg.reward.function:
        return data.SyntheticScorer(cfg.reward)
    # Imported here: it loads math-verify, which the synthetic checker above never needs.
    from dynamo_jax.rewards.scorer import RewardPool

    pool = RewardPool(cfg.reward)
    pool.start()
    return pool


def _rows(cfg: RunConfig, paths: tuple[str, ...]) -> list:
    if cfg.data.task == "synthetic":
        return data.make_synthetic_dataset(cfg.data.synthetic_config())
    d = cfg.data
    return data.load_files(
        paths,
        fmt=d.format,
        on_bad_row=d.on_bad_row,
        id_field=d.id_field,
        max_line_bytes=d.max_line_bytes,
        hub_columns=(d.hub_prompt_column, d.hub_answer_column),
    )[0]


def eval_problems(cfg: RunConfig, tokenizer: Any, max_problems: int = 0) -> tuple[list, list]:
    """(rows, prompt token ids) of the evaluation problems: `data.eval_paths`, or the training
    files when there are none; the synthetic task re-asks its own problems (it has no split)."""
    rows = _rows(cfg, cfg.data.eval_paths or cfg.data.paths)
    if max_problems:
        rows = rows[:max_problems]
    prompts = data.build_prompts(rows, tokenizer, cfg.data)
    return list(prompts.rows), list(prompts.token_ids)


def build_task(cfg: RunConfig) -> Task:
    """The run's training prompts, scorer and evaluation problems (see the module docstring)."""
    tokenizer = task_tokenizer(cfg)
    if cfg.model.vocab_size < len(tokenizer):
        raise ConfigError(
            f"model.vocab_size ({cfg.model.vocab_size}) is smaller than the tokenizer's "
            f"vocabulary ({len(tokenizer)})"
        )
    train_rows = _rows(cfg, cfg.data.paths)
    if cfg.data.max_train_problems:
        train_rows = train_rows[: cfg.data.max_train_problems]
    prompts = data.build_prompts(train_rows, tokenizer, cfg.data)
    if len(prompts.rows) < cfg.train.prompts_per_step:
        raise DataError(
            f"data.paths {list(cfg.data.paths)}: {len(prompts.rows)} usable prompts, fewer than "
            f"train.prompts_per_step ({cfg.train.prompts_per_step})"
        )
    eval_rows, eval_tokens = [], []
    if cfg.data.task == "synthetic" or cfg.data.eval_paths:
        eval_rows, eval_tokens = eval_problems(cfg, tokenizer)
    return Task(
        prompt_ids=np.asarray(prompts.prompt_ids, np.int64),
        prompt_tokens=list(prompts.token_ids),
        answers=[row.gold for row in prompts.rows],
        sources=[row.source for row in prompts.rows],
        stop_token_ids=stop_token_ids(tokenizer),
        pad_id=int(tokenizer.pad_token_id or 0),
        seq_len=cfg.max_seq_len,
        decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
        decode_many=batch_decoder(tokenizer),
        scorer=make_scorer(cfg),
        make_iterator=lambda seed, size: data.EpochIterator(len(prompts.rows), size, seed),
        eval_rows=eval_rows,
        eval_prompt_tokens=eval_tokens,
    )
