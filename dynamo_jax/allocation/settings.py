"""Each allocation policy's own settings: one frozen record per policy, validated on its own.

The user-facing keys stay flat in the `allocation` config section (`AllocationConfig`, e.g.
`allocation.as_run_tie_break`); `AllocationConfig` builds every policy's record from them once,
at the edge, so a bad value is refused whichever policy runs, and the allocator reads only its
own record (`AllocationConfig.settings`). `KEYS` maps a record's field to its config key, which
is the name every error message gives. The policies, with their records, are listed once, in
`allocation/registry.py`.

This module imports nothing of the package but `validate`, so the config can use it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

from dynamo_jax import validate

CLASS = "AllocationConfig"  # errors name the config class and key the user wrote
# Options of the "dynamo" policy (docs/algorithm.md#allocation-variants); the first of each is
# the paper's rule.
ALLOCATE_BY = ("variance", "std")
PRIORITIES = ("unbiased", "posterior")


def require_int(key: str, value: Any) -> None:
    validate.require(validate.is_int(value), CLASS, key, f"must be an int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class PolicySettings:
    """Base of the per-policy records: `KEYS` (record field → config key) and how to build one."""

    KEYS: ClassVar[Mapping[str, str]] = {}
    # Keys only this policy reads, with the value they must keep under any other policy (set
    # there, they would be silently ignored).
    EXCLUSIVE: ClassVar[Mapping[str, Any]] = {}

    @classmethod
    def from_config(cls, config: Any) -> PolicySettings:
        """The record from the flat keys of `config` (an `AllocationConfig`)."""
        return cls(**{field: getattr(config, key) for field, key in cls.KEYS.items()})

    def check_config(self, config: Any) -> None:
        """Checks against the shared keys of `config`, made only when this policy runs."""

    def _require(self, ok: bool, field: str, message: str) -> None:
        validate.require(ok, CLASS, self.KEYS[field], message)


@dataclasses.dataclass(frozen=True)
class UniformSettings(PolicySettings):
    """ "uniform" reads no setting of its own."""


@dataclasses.dataclass(frozen=True)
class DynamoSettings(PolicySettings):
    """ "dynamo" (paper Alg. 1 and its options, docs/algorithm.md#allocation-variants)."""

    KEYS: ClassVar[Mapping[str, str]] = {
        "min_history": "min_history",
        "allocate_by": "allocate_by",
        "priority": "priority",
        "prior_a": "prior_a",
        "prior_b": "prior_b",
        "entropy_factor": "entropy_factor",
    }
    EXCLUSIVE: ClassVar[Mapping[str, Any]] = {
        "allocate_by": "variance",
        "priority": "unbiased",
        "entropy_factor": False,
    }

    min_history: int
    allocate_by: str
    priority: str
    prior_a: float
    prior_b: float
    entropy_factor: bool

    def __post_init__(self):
        require_int("min_history", self.min_history)
        self._require(
            self.min_history >= 2,
            "min_history",
            f"must be >= 2 (P_i is defined for G_i >= 2), got {self.min_history}",
        )
        self._require(
            self.allocate_by in ALLOCATE_BY,
            "allocate_by",
            f"{self.allocate_by!r} not one of {ALLOCATE_BY}",
        )
        self._require(
            self.priority in PRIORITIES, "priority", f"{self.priority!r} not one of {PRIORITIES}"
        )
        for name in ("prior_a", "prior_b"):
            value = getattr(self, name)
            self._require(
                validate.is_number(value) and math.isfinite(value) and value > 0,
                name,
                f"must be a finite number > 0 (a Beta prior count), got {value!r}",
            )
        self._require(
            isinstance(self.entropy_factor, bool),
            "entropy_factor",
            f"must be a bool, got {self.entropy_factor!r}",
        )


@dataclasses.dataclass(frozen=True)
class AsRunSettings(PolicySettings):
    """ "dynamo_as_run": the constants of the authors' released script."""

    KEYS: ClassVar[Mapping[str, str]] = {
        "explore_to": "as_run_explore_to",
        "min_history": "as_run_min_history",
        "tie_break": "as_run_tie_break",
        "priority_floor": "released_priority_floor",
        "mastered_acc": "released_mastered_acc",
    }

    explore_to: int
    min_history: int
    tie_break: float
    priority_floor: float
    mastered_acc: float

    def __post_init__(self):
        for name in ("explore_to", "min_history"):
            require_int(self.KEYS[name], getattr(self, name))
        _check_floor_and_mastered(self)
        self._require(self.explore_to >= 0, "explore_to", f"must be >= 0, got {self.explore_to}")
        self._require(
            self.min_history >= 2,
            "min_history",
            f"must be >= 2 (P_i is defined for G_i >= 2), got {self.min_history}",
        )
        self._require(
            math.isfinite(self.tie_break) and self.tie_break >= 0,
            "tie_break",
            f"must be finite and >= 0, got {self.tie_break}",
        )

    def check_config(self, config: Any) -> None:
        validate.require(
            config.decay == 1.0,
            CLASS,
            "decay",
            "policy 'dynamo_as_run' counts rollouts over the whole run, never decayed; "
            f"need decay=1.0, got {config.decay}",
        )


@dataclasses.dataclass(frozen=True)
class ReleasedSettings(PolicySettings):
    """ "dynamo_released": the constants of the recipe's own dataset class."""

    KEYS: ClassVar[Mapping[str, str]] = {
        "explore_rollouts": "released_explore_rollouts",
        "explore_below": "released_explore_below",
        "priority_floor": "released_priority_floor",
        "mastered_acc": "released_mastered_acc",
    }

    explore_rollouts: int
    explore_below: int
    priority_floor: float
    mastered_acc: float

    def __post_init__(self):
        for name in ("explore_rollouts", "explore_below"):
            require_int(self.KEYS[name], getattr(self, name))
        _check_floor_and_mastered(self)
        self._require(
            self.explore_rollouts >= 1,
            "explore_rollouts",
            f"must be >= 1, got {self.explore_rollouts}",
        )
        self._require(
            self.explore_below >= 0, "explore_below", f"must be >= 0, got {self.explore_below}"
        )


@dataclasses.dataclass(frozen=True)
class E3Settings(PolicySettings):
    """ "e3": the curriculum's widening per epoch."""

    KEYS: ClassVar[Mapping[str, str]] = {"curriculum_step": "e3_curriculum_step"}

    curriculum_step: int

    def __post_init__(self):
        require_int("e3_curriculum_step", self.curriculum_step)
        self._require(
            self.curriculum_step >= 1,
            "curriculum_step",
            f"must be >= 1, got {self.curriculum_step}",
        )


def _check_floor_and_mastered(s: AsRunSettings | ReleasedSettings) -> None:
    """The authors' priority floor and mastered accuracy, shared by both released variants."""
    s._require(
        0.0 < s.priority_floor <= 1.0,
        "priority_floor",
        f"must be in (0, 1], got {s.priority_floor}",
    )
    s._require(
        0.0 < s.mastered_acc <= 1.0, "mastered_acc", f"must be in (0, 1], got {s.mastered_acc}"
    )
