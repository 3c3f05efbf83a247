"""The PPO clip band [1 − ε_low, 1 + ε_high] of the importance ratio r (docs/algorithm.md#policy-loss).

Every use of the band (the clipped surrogate, the clip-fraction metrics, UMS's in-band tokens,
Clip-Cov's candidates) goes through these two functions, so the band is written once.
"""

from __future__ import annotations

import jax.numpy as jnp


def clip_bounds(clip_low: float, clip_high: float) -> tuple[float, float]:
    """(1 − ε_low, 1 + ε_high): the ratios the clipped surrogate leaves unclipped."""
    return 1.0 - clip_low, 1.0 + clip_high


def clip_ratio(r, clip_low: float, clip_high: float):
    """clip(r, 1 − ε_low, 1 + ε_high)."""
    return jnp.clip(r, *clip_bounds(clip_low, clip_high))
