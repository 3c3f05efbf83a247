"""Token-level pieces of the Table 1 baselines against their published formulas."""

import jax.numpy as jnp
import numpy as np

from dynamo_jax.losses.baselines import clipped_by_ppo, entropy_adv_advantage, token_covariance


def test_entropy_advantage_formula_and_sign_preservation():
    adv = jnp.asarray([1.0, -1.0, 0.0, 0.2, -0.3])
    ent = jnp.asarray([0.5, 4.0, 2.0, 3.0, 0.1])
    got = np.asarray(entropy_adv_advantage(adv, ent, 0.4, 2.0))
    want = np.asarray(adv) + np.minimum(0.4 * np.asarray(ent), np.abs(np.asarray(adv)) / 2.0)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.all(np.sign(got[[0, 1, 3, 4]]) == np.sign(np.asarray(adv)[[0, 1, 3, 4]]))
    assert got[2] == 0.0  # A = 0 stays 0


def test_ppo_clipping_indicator_and_covariance():
    adv = jnp.asarray([1.0, 1.0, -1.0, -1.0, 1.0])
    r = jnp.asarray([1.5, 1.1, 0.5, 0.9, 0.5])
    np.testing.assert_array_equal(
        clipped_by_ppo(adv, r, 0.2, 0.28), [True, False, True, False, False]
    )
    cov = token_covariance(jnp.asarray([-1.0, -3.0]), jnp.asarray([2.0, -2.0]), -2.0, 0.0)
    np.testing.assert_allclose(cov, [2.0, 2.0])
