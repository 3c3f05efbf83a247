"""The frozen, validated config of rollout allocation.

docs/algorithm.md#water-level-allocation (DynaMO DRA, the authors' code as run, the recipe's
other heuristic), docs/algorithm.md#allocation-variants (beyond the paper) and
docs/algorithm.md#e3-allocation (E3). `dynamo_jax/config.py` maps the ConfigDict section
`allocation` onto this class; nothing else reads it by key.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dynamo_jax import validate
from dynamo_jax.allocation import registry
from dynamo_jax.allocation.settings import ALLOCATE_BY, PRIORITIES
from dynamo_jax.registry import flat_fields, flat_values, init_flat

__all__ = ["ALLOCATE_BY", "PRIORITIES", "AllocationConfig"]

_require = validate.require  # (ok, class name, field, message)


@dataclasses.dataclass(frozen=True, init=False)
class AllocationConfig:
    """How a batch's rollout budget B = N · n_avg is split over its N prompts.

    policy: a record of `allocation/registry.py` (uniform, dynamo, dynamo_as_run,
    dynamo_released, e3; each allocator's docstring in `allocation/policies.py` says what it
    does). `policy`, `n_avg`, `g_min`, `g_max` and `decay` are shared; every other key of the
    flat `allocation` section is a policy's own: a field of its settings record
    (`allocation/settings.py`, defaults and checks there), built here, at the edge, as
    `settings`; the allocator reads only its record.
    Bounds: every prompt gets n_i in [g_min, g_max] (for "e3" these are the curriculum's
    limits; the bounds start at n_avg and widen by `e3_curriculum_step` per epoch).
    """

    policy: str = "uniform"
    n_avg: int = 8  # default group size G; the batch budget is N · n_avg
    g_min: int = 2
    g_max: int = 16
    # Old counts are multiplied by `decay` before a step's counts are added (1 = the paper).
    decay: float = 1.0
    settings: Any = None  # the running policy's own keys (registry.init_flat builds it)

    def __init__(self, **values: Any):
        init_flat(self, registry.POLICIES, "policy", values, "AllocationConfig")
        self.__post_init__()

    def __post_init__(self):
        c = "AllocationConfig"
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
        self.settings.check_config(self)

    @property
    def reads_entropy(self) -> bool:
        """Whether the policy reads the prompts' mean token entropy (from the log-prob pass)."""
        return self.settings.reads_entropy()

    @classmethod
    def flat_fields(cls) -> dict[str, tuple[Any, Any]]:
        """The section's keys (config.py builds it from these): the shared keys, then every
        registered policy's own keys."""
        return flat_fields(cls, registry.POLICIES)

    def flat(self) -> dict[str, Any]:
        """The section's flat keys as a config file holds them."""
        return flat_values(self, registry.POLICIES)

    def validate_against(self, norm_adv_by_std: bool) -> None:
        """Cross-check with the loss: a group of one response has no std, so no advantage."""
        if norm_adv_by_std and self.g_min < 2:
            raise ValueError(
                f"AllocationConfig.g_min: must be >= 2 when the loss normalises advantages by "
                f"the group std (norm_adv_by_std=True), got {self.g_min}"
            )
