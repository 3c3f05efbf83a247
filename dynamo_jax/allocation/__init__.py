"""Rollout allocation (uniform, DynaMO water-level with its options (docs/algorithm.md#allocation-variants), DynaMO as the authors'
script runs it, the DynaMO recipe's other heuristic, E3 rank) and the sampling-temperature
scheduler (fixed or E3), with the per-prompt history they run on."""

from dynamo_jax.allocation.config import AllocationConfig, TemperatureConfig
from dynamo_jax.allocation.history import PromptHistory
from dynamo_jax.allocation.policies import AllocationResult, Allocator, make_history
from dynamo_jax.allocation.registry import make_allocator
from dynamo_jax.allocation.temperature import TemperatureScheduler

__all__ = [
    "AllocationConfig",
    "AllocationResult",
    "Allocator",
    "PromptHistory",
    "TemperatureConfig",
    "TemperatureScheduler",
    "make_allocator",
    "make_history",
]
