"""Sampling math of the embedded engine against a float64 NumPy transcription of vLLM's rules."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dynamo_jax.rollout import sampling


def vllm_restrict_np(z, k, p):
    """vLLM's apply_top_k_top_p, transcribed: ascending sort, top-k by value, top-p by cumsum."""
    z = np.asarray(z, np.float64)
    out = np.full_like(z, -np.inf)
    for b in range(z.shape[0]):
        order = np.argsort(z[b], kind="stable")
        s = z[b][order]
        if k != -1:
            s = np.where(s < s[-k], -np.inf, s)
        if p < 1.0:
            probs = np.exp(s - s.max())
            probs /= probs.sum()
            mask = np.cumsum(probs) <= 1 - p
            mask[-1] = False
            s = np.where(mask, -np.inf, s)
        out[b, order] = s
    return out


def log_softmax_np(z):
    z = np.asarray(z, np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.sum(np.exp(z - m), -1, keepdims=True))


def _restrict(z, k, p):
    fn = jax.jit(sampling.restrict_top_k_top_p, static_argnames=("use_top_k", "use_top_p"))
    return np.asarray(
        fn(
            jnp.asarray(z, jnp.float32),
            jnp.int32(k),
            jnp.float32(p),
            use_top_k=k != -1,
            use_top_p=p < 1,
        )
    )


@pytest.mark.parametrize(
    "k,p", [(-1, 1.0), (1, 1.0), (7, 1.0), (-1, 0.9), (-1, 0.3), (12, 0.75), (3, 0.999)]
)
def test_restrict_matches_vllm_reference(k, p):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(6, 53)).astype(np.float32) * 2.0
    got = _restrict(z, k, p)
    want = vllm_restrict_np(z, k, p)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_array_equal(got[np.isfinite(got)], z[np.isfinite(want)])


def test_top_k_keeps_all_ties_at_threshold_and_handles_negative_logits():
    z = np.array([[-3.0, -1.0, -1.0, -1.0, -5.0, -0.5]], np.float32)
    got = np.isfinite(_restrict(z, 2, 1.0))[0]
    # 2nd largest is -1.0, and all three copies of it survive (vLLM compares by value).
    np.testing.assert_array_equal(got, [False, True, True, True, False, True])


def test_top_p_keeps_smallest_nucleus_and_always_the_top_token():
    probs = np.array([[0.5, 0.3, 0.15, 0.05]])
    z = np.log(probs).astype(np.float32)
    np.testing.assert_array_equal(np.isfinite(_restrict(z, -1, 0.8))[0], [True, True, False, False])
    np.testing.assert_array_equal(np.isfinite(_restrict(z, -1, 0.81))[0], [True, True, True, False])
    np.testing.assert_array_equal(
        np.isfinite(_restrict(z, -1, 1e-6))[0], [True, False, False, False]
    )


def _sample(logits, keys, temperature, k, p, greedy=False):
    fn = jax.jit(sampling.sample_tokens, static_argnames=("greedy", "use_top_k", "use_top_p"))
    tok, lp = fn(
        jnp.asarray(logits),
        keys,
        jnp.float32(temperature),
        jnp.int32(k),
        jnp.float32(p),
        greedy=greedy,
        use_top_k=k != -1,
        use_top_p=p < 1,
    )
    return np.asarray(tok), np.asarray(lp)


@pytest.mark.parametrize(
    "temperature,k,p", [(1.0, -1, 1.0), (0.7, -1, 0.85), (1.3, 6, 1.0), (0.9, 8, 0.9)]
)
def test_empirical_frequencies_match_restricted_softmax(temperature, k, p):
    n = 40_000
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(12,)).astype(np.float32) * 1.5
    keys = sampling.row_keys(3, np.arange(n), np.zeros(n))
    tok, lp = _sample(np.broadcast_to(logits, (n, 12)), keys, temperature, k, p)
    z = vllm_restrict_np(logits[None] / np.float32(temperature), k, p)[0]
    expected = np.exp(log_softmax_np(z))
    counts = np.bincount(tok, minlength=12)
    support = expected > 0
    assert counts[~support].sum() == 0, "a token outside top-k/top-p was sampled"
    chi2 = np.sum((counts[support] - n * expected[support]) ** 2 / (n * expected[support]))
    p_value = stats.chi2.sf(chi2, df=support.sum() - 1)
    assert p_value > 1e-4, (chi2, counts, n * expected)
    assert 0.5 * np.abs(counts / n - expected).sum() < 0.01
    # Returned log-probs are those of the distribution the token was drawn from.
    np.testing.assert_allclose(lp, np.log(expected[tok]), rtol=1e-5, atol=1e-5)


def test_logprobs_equal_full_log_softmax_at_temperature_when_unrestricted():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(16, 300)).astype(np.float32) * 3
    keys = sampling.row_keys(0, np.arange(16), np.arange(16))
    tok, lp = _sample(logits, keys, 0.6, -1, 1.0)
    want = log_softmax_np(logits.astype(np.float64) / np.float32(0.6))[np.arange(16), tok]
    np.testing.assert_allclose(lp, want, rtol=1e-5, atol=1e-5)


def test_greedy_takes_first_argmax_and_reports_t1_logprob():
    logits = np.array([[0.1, 2.0, 2.0, -1.0], [5.0, 0.0, 0.0, 0.0]], np.float32)
    keys = sampling.row_keys(0, np.arange(2), np.zeros(2))
    tok, lp = _sample(logits, keys, 0.0, -1, 1.0, greedy=True)
    np.testing.assert_array_equal(tok, [1, 0])
    np.testing.assert_allclose(lp, log_softmax_np(logits)[np.arange(2), tok], rtol=1e-6)


def test_inverse_cdf_never_draws_zero_probability_tokens_across_blocks():
    # V spans several 512-wide blocks and is not a multiple of the block; mass only at the edges.
    vocab = 1500
    logits = np.full((4096, vocab), -np.inf, np.float32)
    logits[:, [0, 511, 512, 1499]] = [0.0, 1.0, 2.0, 0.5]
    keys = sampling.row_keys(9, np.arange(4096), np.zeros(4096))
    tok, _ = _sample(logits, keys, 1.0, -1, 1.0)
    assert set(np.unique(tok)) == {0, 511, 512, 1499}


def test_row_keys_depend_on_ids_not_position():
    pids = np.array([5, 2**40 + 5, -3, 7])
    idx = np.array([0, 0, 1, 2])
    a = jax.random.key_data(sampling.row_keys(11, pids, idx))
    perm = np.array([2, 0, 3, 1])
    b = jax.random.key_data(sampling.row_keys(11, pids[perm], idx[perm]))
    np.testing.assert_array_equal(np.asarray(a)[perm], np.asarray(b))
    # The high 32 bits of a prompt id matter, and so does the seed.
    assert not np.array_equal(np.asarray(a)[0], np.asarray(a)[1])
    for other_seed in (12, 11 + 2**32, -11):
        c = jax.random.key_data(sampling.row_keys(other_seed, pids, idx))
        assert not np.array_equal(np.asarray(a), np.asarray(c)), other_seed


def test_row_keys_are_the_fold_in_chain_computed_eagerly():
    """The jitted keys are bit for bit the documented chain fold_in(fold_in(fold_in(base, lo),
    hi), index), base = fold_in(key(seed low 32 bits), seed high 32 bits), run op by op."""
    rng = np.random.default_rng(0)
    pids = rng.integers(-(2**62), 2**62, 64)
    idx = rng.integers(0, 16, 64)
    for seed in (0, -5, 2**40 + 3):
        s = seed & 0xFFFFFFFFFFFFFFFF
        base = jax.random.fold_in(jax.random.key(np.uint32(s & 0xFFFFFFFF)), np.uint32(s >> 32))
        u = pids.astype(np.uint64)
        want = [
            jax.random.key_data(
                jax.random.fold_in(
                    jax.random.fold_in(
                        jax.random.fold_in(base, np.uint32(int(p) & 0xFFFFFFFF)),
                        np.uint32(int(p) >> 32),
                    ),
                    np.uint32(i),
                )
            )
            for p, i in zip(u[:8], idx[:8])
        ]
        got = jax.random.key_data(sampling.row_keys(seed, pids, idx))[:8]
        np.testing.assert_array_equal(np.asarray(got), np.stack([np.asarray(w) for w in want]))
