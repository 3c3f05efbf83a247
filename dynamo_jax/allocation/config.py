"""The frozen, validated config of rollout allocation.

docs/algorithm.md#water-level-allocation (DynaMO DRA, the authors' code as run, the recipe's
other heuristic), docs/algorithm.md#allocation-variants (beyond the paper) and
docs/algorithm.md#e3-allocation (E3). `dynamo_jax/config.py` maps the ConfigDict section
`allocation` onto this class; nothing else reads it by key.
"""

from __future__ import annotations

import dataclasses

from dynamo_jax import validate
from dynamo_jax.allocation import registry
from dynamo_jax.allocation.settings import ALLOCATE_BY, PRIORITIES, PolicySettings

POLICIES = registry.names()  # the one list: allocation/registry.py
__all__ = ["ALLOCATE_BY", "POLICIES", "PRIORITIES", "AllocationConfig"]

_require = validate.require  # (ok, class name, field, message)


@dataclasses.dataclass(frozen=True)
class AllocationConfig:
    """How a batch's rollout budget B = N · n_avg is split over its N prompts.

    policy: a record of `allocation/registry.py` (uniform, dynamo, dynamo_as_run,
    dynamo_released, e3; each allocator's docstring in `allocation/policies.py` says what it
    does). `policy`, `n_avg`, `g_min`, `g_max` and `decay` are shared; the other keys are the
    policies' own settings: they stay flat config keys (their defaults are here, once), and each
    policy's frozen record (`allocation/settings.py`) is built from them here, at the edge; the
    allocator reads only its record (`settings`).
    Bounds: every prompt gets n_i in [g_min, g_max] (for "e3" these are the curriculum's
    limits; the bounds start at n_avg and widen by `e3_curriculum_step` per epoch).
    `allocate_by`, `priority` and `entropy_factor` are options of "dynamo" only
    (docs/algorithm.md#allocation-variants); their defaults are the paper's Alg. 1.
    """

    policy: str = "uniform"
    n_avg: int = 8  # default group size G; the batch budget is N · n_avg
    g_min: int = 2
    g_max: int = 16
    # DynaMO: prompts whose (decayed) rollout count G_i is below this are data-scarce and get
    # n_avg outside the water-filling (paper Appendix D). P_i needs G_i >= 2.
    min_history: int = 2
    # Old counts are multiplied by `decay` before a step's counts are added (1 = the paper).
    decay: float = 1.0
    # E3: after each epoch g_max_e += step and g_min_e -= step, up to [g_min, g_max].
    e3_curriculum_step: int = 2
    # "dynamo" options (docs/algorithm.md#allocation-variants). Weights ∝ σ_i² ("variance",
    # Alg. 1) or σ_i ("std", Appendix C Eq. 36), with σ_i² estimated by the priority below.
    allocate_by: str = "variance"
    # "unbiased": k(G−k)/(G(G−1)) (Eq. 6); "posterior": E[p(1−p)] under Beta(prior_a, prior_b).
    priority: str = "unbiased"
    prior_a: float = 1.0  # Beta prior pseudo-successes of the "posterior" priority
    prior_b: float = 1.0  # Beta prior pseudo-failures of the "posterior" priority
    # σ_i *= sqrt(1 − exp(−H̄_i)) (Eq. 42), H̄_i the prompt's latest mean token entropy.
    entropy_factor: bool = False
    # The authors' constants, shared by "dynamo_as_run" and "dynamo_released" where the meaning
    # is the same: the priority floor and the accuracy at which a prompt counts as mastered.
    released_priority_floor: float = 0.01
    released_mastered_acc: float = 0.85
    # "dynamo_released": prompts with fewer rollouts than `explore_below` get `explore_rollouts`.
    released_explore_rollouts: int = 4
    released_explore_below: int = 4  # prompts with fewer rollouts than this are explored
    # "dynamo_as_run": prompts with G_i < b = max(g_min, this) first get b − G_i rollouts
    # (the trainer's `initial_budget=4`).
    as_run_explore_to: int = 4
    # "dynamo_as_run": priority −1 (left out of the proportional pour) while G_i < this
    # (`update_rank`'s `initial_budget=4`).
    as_run_min_history: int = 4
    as_run_tie_break: float = 1e-6  # "dynamo_as_run": + (1 − k/G) · this separates equal P_i

    def __post_init__(self):
        c = "AllocationConfig"
        _require(self.policy in POLICIES, c, "policy", f"{self.policy!r} not one of {POLICIES}")
        for name in ("n_avg", "g_min", "g_max"):
            value = getattr(self, name)
            _require(validate.is_int(value), c, name, f"must be an int, got {value!r}")
        _require(self.g_min >= 1, c, "g_min", f"must be >= 1, got {self.g_min}")
        _require(
            self.g_min <= self.n_avg <= self.g_max,
            c,
            "n_avg",
            f"need g_min <= n_avg <= g_max, got g_min={self.g_min}, n_avg={self.n_avg}, "
            f"g_max={self.g_max}",
        )
        _require(0.0 < self.decay <= 1.0, c, "decay", f"must be in (0, 1], got {self.decay}")
        # Every policy's settings are built (so validated), whichever policy runs; the running
        # policy's record is the one its allocator reads.
        records = {name: p.settings.from_config(self) for name, p in registry.POLICIES.items()}
        for name, p in registry.POLICIES.items():
            if name == self.policy:
                continue
            # A policy's own option left on under another policy would be silently ignored.
            for key, paper in p.settings.EXCLUSIVE.items():
                _require(
                    getattr(self, key) == paper,
                    c,
                    key,
                    f"is an option of policy {name!r} only; policy {self.policy!r} needs the "
                    f"default {paper!r}, got {getattr(self, key)!r}",
                )
        records[self.policy].check_config(self)
        object.__setattr__(self, "_settings", records[self.policy])

    @property
    def settings(self) -> PolicySettings:
        """The running policy's settings record (allocation/settings.py)."""
        return self._settings

    def validate_against(self, norm_adv_by_std: bool) -> None:
        """Cross-check with the loss: a group of one response has no std, so no advantage."""
        if norm_adv_by_std and self.g_min < 2:
            raise ValueError(
                f"AllocationConfig.g_min: must be >= 2 when the loss normalises advantages by "
                f"the group std (norm_adv_by_std=True), got {self.g_min}"
            )
