"""The allocation policies: one record each (name, settings record, allocator), in one table.

`POLICIES` is a `dynamo_jax.registry.Registry` (the shape every extension point shares).
`AllocationConfig.policy` names a record here; `AllocationConfig` builds the record's settings
from its own flat config keys (the settings record's fields, with their defaults and checks,
`allocation/settings.py`), and `make_allocator` builds the record's allocator. A new policy is
one `register(AllocationPolicy(...))`: its settings record and its allocator class (taking the
`AllocationConfig`) (docs/design.md says the rest).
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
from dynamo_jax.registry import Registry


@dataclasses.dataclass(frozen=True)
class AllocationPolicy:
    """One policy: its settings record (validated on construction) and its allocator."""

    name: str
    summary: str
    settings: type[PolicySettings]
    allocator: Callable[[Any], policies.Allocator]  # AllocationConfig → allocator


# The config keys every policy shares (AllocationConfig's own fields).
SHARED_KEYS = ("policy", "n_avg", "g_min", "g_max", "decay")
POLICIES: Registry[AllocationPolicy] = Registry("allocation policy", shared=SHARED_KEYS)
for _policy in (
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
):
    POLICIES.register(_policy)


def make_allocator(cfg: Any) -> policies.Allocator:
    """The allocator of the policy `cfg` (an `AllocationConfig`) names."""
    return get(cfg.policy).allocator(cfg)


# The table's own functions under the names every extension point's module exposes
# (register refuses a second entry under one name unless replace=True).
register, unregister, names, get = (
    POLICIES.register,
    POLICIES.unregister,
    POLICIES.names,
    POLICIES.get,
)
