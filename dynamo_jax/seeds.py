"""Every random stream of a run is a function of (train.seed, step, stream): resume replays it."""

from __future__ import annotations

import numpy as np

ROLLOUT = 0  # the engine's sampling seed of a step (extra index: dynamic sampling's round)
MINI_BATCH = 1  # the permutation of a step's responses into mini-batches
EVAL = 2  # the evaluation's sampling seed


def step_seed(seed: int, step: int, stream: int, *index: int) -> int:
    """A 32-bit seed for one random stream of one step (`index`: a sub-stream, e.g. a round)."""
    return int(np.random.SeedSequence([seed, step, stream, *index]).generate_state(1)[0])
