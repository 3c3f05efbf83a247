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

import numpy as np

from dynamo_jax.rollout.protocol import Completion


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
    scorer: Callable[[list[str], list[str]], np.ndarray]  # (texts, golds) → rewards
    make_iterator: Callable[[int], Any]  # seed → checkpointable epoch iterator over rows
    eval_problems: list[dict] = dataclasses.field(default_factory=list)
    closers: list[Callable[[], None]] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.tokens_by_id = {int(i): t for i, t in zip(self.prompt_ids, self.prompt_tokens)}
        self._answer_by_id = {int(i): a for i, a in zip(self.prompt_ids, self.answers)}
        if len(self.tokens_by_id) != len(self.prompt_ids):
            raise ValueError("Task: prompt ids are not unique")

    @property
    def num_prompts(self) -> int:
        return len(self.prompt_ids)

    def iterator(self, seed: int) -> Any:
        return self.make_iterator(seed)

    def score(self, completions: Sequence[Completion]) -> np.ndarray:
        texts = [self.decode(c.token_ids) for c in completions]
        golds = [self._answer_by_id[int(c.prompt_id)] for c in completions]
        return np.asarray(self.scorer(texts, golds), np.float32)

    def close(self) -> None:
        for close in self.closers:
            close()


def build_engine(cfg: Any, params: Any, mesh: Any, param_shardings: Any, workdir: Any) -> Any:
    """The configured `RolloutEngine`, holding `params` as weight version 0."""
    if cfg.rollout.engine == "jax":
        from dynamo_jax.rollout.jax_engine import JaxEngine

        return JaxEngine(
            cfg.model,
            params,
            cfg.jax_engine,
            mesh=mesh,
            rules=cfg.mesh.rules,
            param_shardings=param_shardings,
        )
    from dynamo_jax.rollout.sidecar_client import SidecarConfig, VLLMSidecarEngine

    if not cfg.init.checkpoint:
        raise ValueError("rollout.engine='vllm' needs init.checkpoint (vLLM starts from HF files)")
    sidecar = SidecarConfig(
        python=cfg.rollout.sidecar_python,
        model_path=cfg.init.checkpoint,
        dtype=cfg.rollout.vllm_dtype,
        max_model_len=cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens,
        seed=cfg.train.seed,
        enforce_eager=cfg.rollout.vllm_enforce_eager,
        gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
        max_num_seqs=cfg.rollout.vllm_max_num_seqs,
    )
    # Weight version 0 is init.checkpoint itself, which is what `params` were loaded from.
    return VLLMSidecarEngine(sidecar, cfg.model, workdir=workdir)
