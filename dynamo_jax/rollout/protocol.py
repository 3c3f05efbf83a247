"""The rollout-engine protocol the trainer talks to.

Both engines (the embedded JAX sampler and the vLLM sidecar client) implement `RolloutEngine`,
so the trainer never knows which one it drives, and one test suite can check both.

Conventions shared by every engine:
- A `Request` carries one prompt's token ids and its own sample count `n` (counts differ per
  prompt within one call: that is what rollout allocation produces).
- Sampling follows vLLM's definitions: logits / temperature (temperature == 0 means greedy),
  then top-k (-1 = off), then top-p (1.0 = off) over the tempered distribution.
- Randomness is keyed by (sampling.seed, prompt_id, sample_index), never by a request's position
  in the batch, so the same seed gives the same completions regardless of batch order.
- A completion's `token_ids` include the stop token that ended it (the policy must learn to
  stop, so that token is trained on); `finish_reason` is "stop" then, "length" otherwise.
- `logprobs[t]` is the engine's log-probability of `token_ids[t]` under the tempered (and
  top-k/top-p restricted) sampling distribution. The trainer recomputes its own old log-probs;
  these are for checking and diagnostics.
- Every completion carries the `weight_version` of the parameters that produced it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

FinishReason = Literal["stop", "length"]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample. Field meanings match vLLM's `SamplingParams`."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(
                f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}"
            )
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1 (off) or >= 1, got {self.top_k}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclasses.dataclass(frozen=True)
class Request:
    """One prompt and how many completions to draw for it."""

    prompt_id: int
    prompt_token_ids: tuple[int, ...]
    n: int

    def __post_init__(self):
        if self.n < 0:
            raise ValueError(f"Request.n must be >= 0, got {self.n} (prompt_id {self.prompt_id})")
        if len(self.prompt_token_ids) == 0:
            raise ValueError(f"Request for prompt_id {self.prompt_id} has an empty prompt")
        object.__setattr__(self, "prompt_token_ids", tuple(int(t) for t in self.prompt_token_ids))


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sampled response."""

    prompt_id: int
    sample_index: int  # 0..n-1 within its request
    token_ids: np.ndarray  # int32 [L]
    logprobs: np.ndarray  # float32 [L]
    finish_reason: FinishReason
    weight_version: int


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer needs from a rollout engine."""

    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Completion]:
        """Completions for every request, grouped by request in request order, then by sample_index."""
        ...

    def update_weights(self, params: Any, version: int) -> None:
        """Make `params` (the trainer's parameter tree) the weights of every later generate call."""
        ...

    @property
    def weight_version(self) -> int: ...

    def close(self) -> None:
        """Release the engine's resources (processes, device memory). Idempotent."""
        ...
