"""Math rewards: math-verify scoring of untrusted completions in a time-limited worker pool."""

from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.math_check import score_one
from dynamo_jax.rewards.scorer import RewardPool
from dynamo_jax.rewards.verdict import STATUSES, Verdict

__all__ = ["STATUSES", "RewardConfig", "RewardPool", "Verdict", "score_one"]
