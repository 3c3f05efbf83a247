"""Rollout allocation (uniform, DynaMO water-level with its options (docs/algorithm.md#allocation-variants), DynaMO as the authors'
script runs it, the DynaMO recipe's other heuristic, E3 rank), with the per-prompt history it
runs on. The sampling temperature has its own package, dynamo_jax/temperature/."""

from dynamo_jax.allocation.config import AllocationConfig
from dynamo_jax.allocation.history import PromptHistory
from dynamo_jax.allocation.policies import AllocationResult, Allocator, make_history
from dynamo_jax.allocation.registry import make_allocator

__all__ = [
    "AllocationConfig",
    "AllocationResult",
    "Allocator",
    "PromptHistory",
    "make_allocator",
    "make_history",
]
