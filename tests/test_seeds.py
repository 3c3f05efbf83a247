"""Random streams are functions of (seed, step, stream)."""

import numpy as np

from dynamo_jax.seeds import step_seed


def test_step_seeds_differ_per_stream_and_step():
    seeds = {step_seed(0, s, k) for s in range(50) for k in range(3)}
    assert len(seeds) == 150
    assert step_seed(0, 5, 0) == step_seed(0, 5, 0)


def test_sub_streams_differ_and_leave_the_plain_stream_unchanged():
    # SeedSequence([0, 5, 0]) is the plain rollout stream of step 5 (pinned: resuming runs made
    # before sub-streams existed must replay the same seeds).
    assert step_seed(0, 5, 0) == int(np.random.SeedSequence([0, 5, 0]).generate_state(1)[0])
    rounds = {step_seed(0, 5, 0, r) for r in range(1, 20)}
    assert len(rounds) == 19 and step_seed(0, 5, 0) not in rounds
