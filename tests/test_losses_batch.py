"""Masked reductions behind the mini-batch statistics."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamo_jax.losses.batch import kth_smallest, log_ratio, masked_max, masked_min, masked_quantile

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
