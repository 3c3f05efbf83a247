"""Random streams are functions of (seed, step, stream)."""

from dynamo_jax.seeds import step_seed


def test_step_seeds_differ_per_stream_and_step():
    seeds = {step_seed(0, s, k) for s in range(50) for k in range(3)}
    assert len(seeds) == 150
    assert step_seed(0, 5, 0) == step_seed(0, 5, 0)
