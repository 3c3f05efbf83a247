"""Math rewards: math-verify scoring of untrusted completions in a time-limited worker pool.

`score_one` and `RewardPool` are imported on first use: they load SymPy and math-verify
(~0.5 s), which a run whose task scores itself (the synthetic one) never needs.
"""

from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.verdict import STATUSES, Verdict

__all__ = ["STATUSES", "RewardConfig", "RewardPool", "Verdict", "score_one"]


def __getattr__(name: str):
    if name == "score_one":
        from dynamo_jax.rewards.math_check import score_one

        return score_one
    if name == "RewardPool":
        from dynamo_jax.rewards.scorer import RewardPool

        return RewardPool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
