"""Masked and per-sequence (per-segment) reductions behind the mini-batch statistics."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamo_jax.losses.batch import (
    at_tokens,
    count_sequences,
    kth_smallest,
    log_ratio,
    masked_max,
    masked_min,
    masked_quantile,
    segment_sums,
)

_quantile = jax.jit(masked_quantile)
_kth = jax.jit(kth_smallest)


@settings(deadline=None, max_examples=40)
@given(st.lists(st.floats(-100, 100, allow_nan=False), min_size=12, max_size=12),
       st.lists(st.booleans(), min_size=12, max_size=12), st.floats(0, 1))  # fmt: skip
def test_masked_quantile_matches_numpy_linear(values, mask, q):
    x = np.asarray(values, np.float32).reshape(3, 4)
    m = np.asarray(mask).reshape(3, 4)
    got = float(_quantile(jnp.asarray(x), jnp.asarray(m), q))
    if not m.any():
        assert got == np.inf
    else:
        np.testing.assert_allclose(
            got, np.quantile(x[m].astype(np.float64), q), rtol=1e-5, atol=1e-4
        )


def test_kth_smallest_min_max_and_ratio_clamp():
    x = jnp.asarray([[5.0, 1.0, 3.0], [2.0, 9.0, 4.0]])
    m = jnp.asarray([[True, True, False], [True, False, True]])
    assert [float(_kth(x, m, k)) for k in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 5.0, np.inf]
    assert float(_kth(x, m, 7)) == np.inf
    assert float(masked_min(x, m)) == 1.0 and float(masked_max(x, m)) == 5.0
    assert float(masked_min(x, m & False)) == 0.0
    lr = log_ratio(jnp.asarray([0.0, 0.0, 3.0]), jnp.asarray([-50.0, 50.0, jnp.nan]),
                   jnp.asarray([True, True, False]))  # fmt: skip
    np.testing.assert_array_equal(lr, [20.0, -20.0, 0.0])


def test_segment_sums_count_and_broadcast_per_packed_sequence():
    # Row 0 holds sequences 1 (3 slots) and 2 (2 slots), then an empty slot; row 1 holds one
    # sequence of 4 slots, then 2 empty ones.
    seg = jnp.asarray([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0]], jnp.int32)
    x = jnp.asarray([[1.0, 2.0, 3.0, 10.0, 20.0, 99.0], [5.0, 6.0, 7.0, 8.0, 98.0, 97.0]])
    sums = np.asarray(jax.jit(segment_sums)(x, seg))
    # Column k is segment k's sum, column 0 the empty slots': 1+2+3 = 6, 10+20 = 30, 5+6+7+8 = 26.
    np.testing.assert_array_equal(sums, [[99, 6, 30, 0, 0, 0, 0], [195, 26, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(
        at_tokens(sums, seg), [[6, 6, 6, 30, 30, 99], [26, 26, 26, 26, 195, 195]]
    )
    # Valid tokens: all of row 0's sequence 1, none of its sequence 2, one of row 1's.
    mask = jnp.asarray([[1, 1, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0]], bool)
    assert float(count_sequences(mask, seg)) == 2.0
    assert float(count_sequences(mask | (seg == 2), seg)) == 3.0
    assert float(count_sequences(mask & False, seg)) == 0.0
