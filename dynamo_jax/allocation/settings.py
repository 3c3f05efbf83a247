"""Each allocation policy's own settings: one frozen record per policy, validated on its own.

A record's fields are its config keys in the flat `allocation` section (e.g.
`allocation.as_run_tie_break`), with their defaults and checks: the policy owns them
(`registry.init_flat` builds the running policy's record, `AllocationConfig.settings`; another
policy's key may only hold its default). The policies, with their records, are listed once, in
`allocation/registry.py`.

This module imports nothing of the package but `validate`, so the config can use it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

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
    """Base of the per-policy records."""

    def check_config(self, config: Any) -> None:
        """Checks against the shared keys of `config`, made only when this policy runs."""

    def reads_entropy(self) -> bool:
        """Whether the policy reads the prompts' mean token entropy (from the log-prob pass)."""
        return False

    def _require(self, ok: bool, field: str, message: str) -> None:
        validate.require(ok, CLASS, field, message)


@dataclasses.dataclass(frozen=True)
class UniformSettings(PolicySettings):
    """ "uniform" reads no setting of its own."""


@dataclasses.dataclass(frozen=True)
class DynamoSettings(PolicySettings):
    """ "dynamo" (paper Alg. 1 and its options, docs/algorithm.md#allocation-variants); the
    defaults are the paper's Alg. 1."""

    # Prompts whose (decayed) rollout count G_i is below this are data-scarce and get n_avg
    # outside the water-filling (paper Appendix D). P_i needs G_i >= 2.
    min_history: int = 2
    # Weights ∝ σ_i² ("variance", Alg. 1) or σ_i ("std", Appendix C Eq. 36), with σ_i²
    # estimated by the priority below.
    allocate_by: str = "variance"
    # "unbiased": k(G−k)/(G(G−1)) (Eq. 6); "posterior": E[p(1−p)] under Beta(prior_a, prior_b).
    priority: str = "unbiased"
    prior_a: float = 1.0  # Beta prior pseudo-successes of the "posterior" priority
    prior_b: float = 1.0  # Beta prior pseudo-failures of the "posterior" priority
    # σ_i *= sqrt(1 − exp(−H̄_i)) (Eq. 42), H̄_i the prompt's latest mean token entropy.
    entropy_factor: bool = False

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

    def reads_entropy(self) -> bool:
        return self.entropy_factor


@dataclasses.dataclass(frozen=True)
class AsRunSettings(PolicySettings):
    """ "dynamo_as_run": the constants of the authors' released script."""

    # Prompts with G_i < b = max(g_min, this) first get b − G_i rollouts (the trainer's
    # `initial_budget=4`).
    as_run_explore_to: int = 4
    # Priority −1 (left out of the proportional pour) while G_i < this (`update_rank`'s
    # `initial_budget=4`).
    as_run_min_history: int = 4
    as_run_tie_break: float = 1e-6  # + (1 − k/G) · this separates equal P_i
    as_run_priority_floor: float = 0.01  # the authors' priority floor
    as_run_mastered_acc: float = 0.85  # the accuracy at which a prompt counts as mastered

    def __post_init__(self):
        for name in ("as_run_explore_to", "as_run_min_history"):
            require_int(name, getattr(self, name))
        _check_floor_and_mastered(self, "as_run_")
        self._require(
            self.as_run_explore_to >= 0,
            "as_run_explore_to",
            f"must be >= 0, got {self.as_run_explore_to}",
        )
        self._require(
            self.as_run_min_history >= 2,
            "as_run_min_history",
            f"must be >= 2 (P_i is defined for G_i >= 2), got {self.as_run_min_history}",
        )
        self._require(
            math.isfinite(self.as_run_tie_break) and self.as_run_tie_break >= 0,
            "as_run_tie_break",
            f"must be finite and >= 0, got {self.as_run_tie_break}",
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

    released_explore_rollouts: int = 4  # what prompts below `released_explore_below` get
    released_explore_below: int = 4  # prompts with fewer rollouts than this are explored
    released_priority_floor: float = 0.01  # the authors' priority floor
    released_mastered_acc: float = 0.85  # the accuracy at which a prompt counts as mastered

    def __post_init__(self):
        for name in ("released_explore_rollouts", "released_explore_below"):
            require_int(name, getattr(self, name))
        _check_floor_and_mastered(self, "released_")
        self._require(
            self.released_explore_rollouts >= 1,
            "released_explore_rollouts",
            f"must be >= 1, got {self.released_explore_rollouts}",
        )
        self._require(
            self.released_explore_below >= 0,
            "released_explore_below",
            f"must be >= 0, got {self.released_explore_below}",
        )


@dataclasses.dataclass(frozen=True)
class E3Settings(PolicySettings):
    """ "e3": the curriculum's widening per epoch."""

    # After each epoch g_max_e += step and g_min_e -= step, up to [g_min, g_max].
    e3_curriculum_step: int = 2

    def __post_init__(self):
        require_int("e3_curriculum_step", self.e3_curriculum_step)
        self._require(
            self.e3_curriculum_step >= 1,
            "e3_curriculum_step",
            f"must be >= 1, got {self.e3_curriculum_step}",
        )


def _check_floor_and_mastered(s: AsRunSettings | ReleasedSettings, prefix: str) -> None:
    """The authors' priority floor and mastered accuracy (each released variant has its own)."""
    floor, mastered = getattr(s, f"{prefix}priority_floor"), getattr(s, f"{prefix}mastered_acc")
    s._require(0.0 < floor <= 1.0, f"{prefix}priority_floor", f"must be in (0, 1], got {floor}")
    s._require(0.0 < mastered <= 1.0, f"{prefix}mastered_acc", f"must be in (0, 1], got {mastered}")
