"""The allocation policies: one record each (name, settings record, allocator), in one table.

`AllocationConfig.policy` names a record here; `AllocationConfig` builds the record's settings
from its flat config keys (validation lives in the settings record, `allocation/settings.py`),
and `make_allocator` builds the record's allocator. A new policy is one `AllocationPolicy` in
`POLICIES` below: its settings record, its allocator class (taking the `AllocationConfig`), and
its config keys added to `AllocationConfig` (docs/design.md says where).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from dynamo_jax.allocation import policies
from dynamo_jax.allocation.settings import (
    AsRunSettings,
    DynamoSettings,
    E3Settings,
    PolicySettings,
    ReleasedSettings,
    UniformSettings,
)


@dataclasses.dataclass(frozen=True)
class AllocationPolicy:
    """One policy: its settings record (validated on construction) and its allocator."""

    name: str
    summary: str
    settings: type[PolicySettings]
    allocator: Callable[[Any], policies.Allocator]  # AllocationConfig → allocator


POLICIES: dict[str, AllocationPolicy] = {
    p.name: p
    for p in (
        AllocationPolicy(
            "uniform",
            "n_avg each (the GRPO baseline; DynaMO's 'DRA off' ablation)",
            UniformSettings,
            policies.UniformAllocator,
        ),
        AllocationPolicy(
            "dynamo",
            "DynaMO paper Alg. 1 water-level allocation, with its options",
            DynamoSettings,
            policies.DynamoAllocator,
        ),
        AllocationPolicy(
            "dynamo_as_run",
            "what the DynaMO authors' released script runs",
            AsRunSettings,
            policies.AsRunDynamoAllocator,
        ),
        AllocationPolicy(
            "dynamo_released",
            "the heuristic of the DynaMO recipe's own dataset class",
            ReleasedSettings,
            policies.ReleasedDynamoAllocator,
        ),
        AllocationPolicy(
            "e3",
            "E3 difficulty-rank allocation with the widening curriculum",
            E3Settings,
            policies.E3Allocator,
        ),
    )
}


def make_allocator(cfg: Any) -> policies.Allocator:
    """The allocator of the policy `cfg` (an `AllocationConfig`) names."""
    return get(cfg.policy).allocator(cfg)


def names() -> tuple[str, ...]:
    return tuple(POLICIES)


def get(name: str) -> AllocationPolicy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown allocation policy {name!r}; registered: {names()}") from None
