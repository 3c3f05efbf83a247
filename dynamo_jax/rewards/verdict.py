"""The result of scoring one completion: a reward and the reason for it."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from dynamo_jax.rewards.config import RewardConfig

Status = Literal["correct", "wrong", "no_answer", "timeout", "parse_error"]
STATUSES: tuple[str, ...] = ("correct", "wrong", "no_answer", "timeout", "parse_error")

# The extracted answer is kept for logs and reports only; bound it so a hostile completion
# cannot bloat them.
_MAX_ANSWER_REPR = 200


@dataclasses.dataclass(frozen=True)
class Verdict:
    """reward: the scalar the trainer uses; status: why; answer: the extracted final answer
    (None when nothing was extracted); detail: a short human-readable reason for non-correct
    statuses."""

    reward: float
    status: Status
    answer: str | None = None
    detail: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"Verdict.status must be one of {STATUSES}, got {self.status!r}")
        if self.answer is not None and len(self.answer) > _MAX_ANSWER_REPR:
            object.__setattr__(self, "answer", self.answer[:_MAX_ANSWER_REPR] + "...")


def reward_for(status: Status, cfg: RewardConfig) -> float:
    """The configured reward of a status: correct, no answer, or anything else (= wrong)."""
    if status == "correct":
        return float(cfg.correct_reward)
    if status == "no_answer":
        return float(cfg.no_answer_reward)
    return float(cfg.wrong_reward)


def make_verdict(status: Status, cfg: RewardConfig, answer=None, detail: str = "") -> Verdict:
    return Verdict(reward_for(status, cfg), status, answer, detail)
