"""The embedded JAX rollout engine: greedy parity with transformers, sampling correctness against
the model's own full forward, per-prompt counts, seed determinism, compaction, bounded
compilation, and sharded execution on a simulated 8-device mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_fixtures import make_tiny_hf_checkpoint
from jax.sharding import Mesh
from scipy import stats

from dynamo_jax.models.hf_io import load_hf_checkpoint
from dynamo_jax.models.presets import get_preset
from dynamo_jax.models.qwen import forward, init_params, param_logical_axes
from dynamo_jax.rollout.jax_engine import JaxEngine, JaxEngineConfig
from dynamo_jax.rollout.protocol import Request, RolloutEngine, SamplingParams


def vllm_restrict_np(z, k, p):
    """vLLM's apply_top_k_top_p on one row, float64 (same transcription as test_rollout_sampling)."""
    z = np.asarray(z, np.float64)
    order = np.argsort(z, kind="stable")
    s = z[order]
    if k != -1:
        s = np.where(s < s[-k], -np.inf, s)
    if p < 1.0:
        probs = np.exp(s - s.max())
        probs /= probs.sum()
        mask = np.cumsum(probs) <= 1 - p
        mask[-1] = False
        s = np.where(mask, -np.inf, s)
    out = np.empty_like(z)
    out[order] = s
    return out


def log_softmax_np(z):
    z = np.asarray(z, np.float64)
    m = np.max(z, -1, keepdims=True)
    return z - m - np.log(np.sum(np.exp(z - m), -1, keepdims=True))


@pytest.fixture(scope="module")
def model():
    cfg = get_preset("tiny-qwen2")
    params = init_params(cfg, jax.random.key(0))
    # Random init gives near-uniform logits; sharpen them so that sampling tests see a peaked
    # distribution (a real model's regime) and greedy has no near-ties.
    params["final_norm"]["scale"] = params["final_norm"]["scale"] * 40.0
    return cfg, params


@pytest.fixture(scope="module")
def engine(model):
    cfg, params = model
    # One batch bucket (16) for every small call below, so the tests share compiled programs.
    return JaxEngine(cfg, params, JaxEngineConfig(min_batch=16, decode_chunk=4))


def _prompts(rng, vocab, lengths):
    return [tuple(int(t) for t in rng.integers(0, vocab, size=n)) for n in lengths]


def _by_key(completions):
    return {(c.prompt_id, c.sample_index): c for c in completions}


def _full_logits(cfg, params, sequences, length=32):
    """The trainer's view: one full forward over right-padded sequences, float32 [N, length, V]."""
    tokens = np.zeros((len(sequences), length), np.int32)
    mask = np.zeros((len(sequences), length), np.int32)
    for i, seq in enumerate(sequences):
        tokens[i, : len(seq)], mask[i, : len(seq)] = seq, 1
    positions = jnp.broadcast_to(jnp.arange(length), tokens.shape)
    return np.asarray(forward(params, cfg, jnp.asarray(tokens), positions, jnp.asarray(mask)))


def test_engine_satisfies_protocol(engine):
    assert isinstance(engine, RolloutEngine)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_greedy_equals_transformers_generate_with_mixed_lengths_and_mid_batch_eos(tmp_path, family):
    import torch
    import transformers

    path = make_tiny_hf_checkpoint(tmp_path, family, tie=family == "qwen3", vocab=256)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).float().eval()
    cfg, params = load_hf_checkpoint(path)
    rng = np.random.default_rng(0)
    prompts = _prompts(rng, cfg.vocab_size, [2, 7, 13, 4])
    max_new = 12

    def hf_greedy(prompt, eos):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=0,
            )
        return out[0, len(prompt) :].numpy()

    # EOS = the 5th greedy token of prompt 1 (first occurrence): that row stops mid-generation.
    free = hf_greedy(prompts[1], None)
    eos = int(free[4])
    assert eos not in free[:4]
    want = [hf_greedy(p, eos) for p in prompts]
    eng = JaxEngine(cfg, params, JaxEngineConfig(min_batch=4))
    sp = SamplingParams(max_new_tokens=max_new, temperature=0.0, stop_token_ids=(eos,))
    got = eng.generate([Request(i, p, 1) for i, p in enumerate(prompts)], sp)
    for c, w in zip(got, want):
        np.testing.assert_array_equal(c.token_ids, w)
        assert c.finish_reason == ("stop" if w[-1] == eos and len(w) <= max_new else "length")
    assert got[1].finish_reason == "stop" and len(got[1].token_ids) == 5
    assert any(c.finish_reason == "length" for c in got), "no row outlived the EOS row"


def test_logprobs_equal_trainer_log_pi_at_temperature(model, engine):
    cfg, params = model
    rng = np.random.default_rng(1)
    prompts = _prompts(rng, cfg.vocab_size, [5, 11])
    temperature = 0.7
    sp = SamplingParams(max_new_tokens=9, temperature=temperature, seed=4)
    out = engine.generate([Request(i, p, 2) for i, p in enumerate(prompts)], sp)
    all_logits = _full_logits(cfg, params, [prompts[c.prompt_id] + tuple(c.token_ids) for c in out])
    for c, logits in zip(out, all_logits):
        prompt = prompts[c.prompt_id]
        # Row t of the full forward predicts token t+1: completion token j is predicted by
        # position len(prompt) - 1 + j.
        pred = logits[len(prompt) - 1 : len(prompt) - 1 + len(c.token_ids)]
        log_pi = log_softmax_np(pred.astype(np.float64) / np.float32(temperature))
        want = log_pi[np.arange(len(c.token_ids)), c.token_ids]
        np.testing.assert_allclose(c.logprobs, want, rtol=0, atol=2e-4)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.8, -1, 1.0), (1.2, 12, 0.9)])
def test_first_token_frequencies_match_restricted_softmax(model, engine, temperature, top_k, top_p):
    cfg, params = model
    prompt = (3, 17, 250, 9)
    n = 2048
    sp = SamplingParams(max_new_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p, seed=2)
    out = engine.generate([Request(0, prompt, n)], sp)
    assert len(out) == n
    first = np.array([c.token_ids[0] for c in out])
    z = _full_logits(cfg, params, [prompt])[0, len(prompt) - 1] / np.float32(temperature)
    expected = np.exp(log_softmax_np(vllm_restrict_np(z, top_k, top_p)))
    counts = np.bincount(first, minlength=cfg.vocab_size)
    support = expected > 0
    assert counts[~support].sum() == 0, "sampled a token outside the top-k/top-p set"
    # Pool the rare tokens into one cell so the chi-square approximation holds.
    rare = support & (n * expected < 5)
    obs = np.append(counts[support & ~rare], counts[rare].sum())
    exp = np.append(n * expected[support & ~rare], n * expected[rare].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    chi2 = np.sum((obs - exp) ** 2 / exp)
    assert stats.chi2.sf(chi2, df=len(obs) - 1) > 1e-4, (chi2, obs, exp)
    assert 0.5 * np.abs(counts / n - expected).sum() < 0.05
    lp = np.array([c.logprobs[0] for c in out])
    np.testing.assert_allclose(lp, np.log(expected[first]), atol=2e-4)


def test_per_prompt_counts_grouping_and_seed_determinism(model, engine):
    cfg, _ = model
    rng = np.random.default_rng(3)
    prompts = _prompts(rng, cfg.vocab_size, [4, 13, 7, 2])
    reqs = [Request(100 + i, p, n) for i, (p, n) in enumerate(zip(prompts, [1, 3, 0, 8]))]
    sp = SamplingParams(max_new_tokens=6, temperature=1.0, seed=7)
    out = engine.generate(reqs, sp)
    assert [(c.prompt_id, c.sample_index) for c in out] == [
        (r.prompt_id, j) for r in reqs for j in range(r.n)
    ]
    assert all(c.weight_version == engine.weight_version for c in out)
    assert all(len(c.token_ids) == len(c.logprobs) == 6 for c in out)
    # Same seed, requests in another order: identical completions for every (prompt, sample).
    shuffled = [reqs[i] for i in (3, 0, 2, 1)]
    again = _by_key(engine.generate(shuffled, sp))
    for key, c in _by_key(out).items():
        np.testing.assert_array_equal(again[key].token_ids, c.token_ids)
        np.testing.assert_array_equal(again[key].logprobs, c.logprobs)
    # The samples of one prompt differ from each other, and another seed changes them.
    eight = [tuple(c.token_ids) for c in out if c.prompt_id == 103]
    assert len(set(eight)) > 1
    other = _by_key(engine.generate(reqs, SamplingParams(max_new_tokens=6, seed=8)))
    assert any(not np.array_equal(other[k].token_ids, c.token_ids) for k, c in _by_key(out).items())


def test_stop_tokens_compaction_and_splitting_do_not_change_results(model, engine):
    cfg, params = model
    rng = np.random.default_rng(4)
    prompts = _prompts(rng, cfg.vocab_size, [3, 6, 9, 12, 5])
    reqs = [Request(i, p, 3) for i, p in enumerate(prompts)]
    # 15 rows fit the module engine's smallest bucket (16) in one batch: it cannot compact.
    free = engine.generate(reqs, SamplingParams(max_new_tokens=16, seed=5))
    # Stop on tokens that the unconstrained run produces early in half the rows: those rows must
    # then end there, with the stop token included, while the rest keep running.
    stops = tuple({int(c.token_ids[3]) for c in free[::2]})
    sp = SamplingParams(max_new_tokens=16, seed=5, stop_token_ids=stops)
    ref = engine.generate(reqs, sp)
    for c, f in zip(ref, free):
        hits = np.flatnonzero(np.isin(f.token_ids, stops))
        n = hits[0] + 1 if len(hits) else 16
        np.testing.assert_array_equal(c.token_ids, f.token_ids[:n])
        np.testing.assert_array_equal(c.logprobs, f.logprobs[:n])
        assert c.finish_reason == ("stop" if len(hits) else "length")
    assert {c.finish_reason for c in ref} == {"stop", "length"}
    # Split into batches of 8 and compacted to 4 rows as rows finish: same completions.
    compacting = JaxEngine(cfg, params, JaxEngineConfig(min_batch=4, decode_chunk=2, max_batch=8))
    got = compacting.generate(reqs, sp)
    assert compacting.compilations.get("compact", 0) >= 1, "no compaction happened"
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
        assert a.finish_reason == b.finish_reason


def test_two_hundred_calls_compile_a_bounded_number_of_programs(model):
    cfg, params = model
    eng = JaxEngine(cfg, params, JaxEngineConfig(min_batch=16, decode_chunk=4))
    rng = np.random.default_rng(6)
    for step in range(200):
        reqs = [
            Request(
                step * 10 + i,
                tuple(int(t) for t in rng.integers(0, cfg.vocab_size, size=rng.integers(1, 25))),
                int(rng.integers(1, 9)),
            )
            for i in range(int(rng.integers(1, 3)))
        ]
        sp = SamplingParams(
            max_new_tokens=int(rng.integers(1, 5)),
            temperature=float(rng.uniform(0.5, 1.5)),
            stop_token_ids=(int(rng.integers(0, cfg.vocab_size)),),
            seed=step,
        )
        out = eng.generate(reqs, sp)
        assert [(c.prompt_id, c.sample_index) for c in out] == [
            (r.prompt_id, j) for r in reqs for j in range(r.n)
        ]
    # 1..16 rows -> batch bucket 16; prompts of 1..24 tokens -> length buckets {16, 32}; one
    # generation bucket (16). Temperature, stop ids, max_new_tokens and seed are traced values,
    # so at most 2 prefill + 2 decode programs (fewer if another test already compiled them).
    counts = eng.compilations
    assert counts.get("prefill", 0) <= 2 and counts.get("decode", 0) <= 2, counts
    assert eng.num_compilations <= 4, counts


def test_update_weights_swaps_the_reference_without_copying(model):
    cfg, params = model
    eng = JaxEngine(cfg, params, JaxEngineConfig(min_batch=16), weight_version=1)
    assert eng._params is params
    req = [Request(0, (1, 2, 3), 1)]
    sp = SamplingParams(max_new_tokens=5, temperature=0.0)
    before = eng.generate(req, sp)[0]
    assert before.weight_version == 1
    new_params = jax.tree.map(lambda x: x * 1.5, params)
    eng.update_weights(new_params, 2)
    assert eng._params is new_params and eng.weight_version == 2
    after = eng.generate(req, sp)[0]
    assert after.weight_version == 2
    assert not np.array_equal(before.logprobs, after.logprobs)


def test_sharded_engine_on_a_mesh_matches_unsharded(model, engine):
    from dynamo_jax.sharding import rules as sharding_rules

    if len(jax.devices()) < 8:  # the CPU tests simulate 8 (conftest); one GPU is one
        pytest.skip(f"needs 8 devices for a (2, 2, 2) mesh, this backend has {len(jax.devices())}")
    cfg, params = model
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
    shardings = sharding_rules.param_shardings(
        params, param_logical_axes(cfg), mesh, sharding_rules.DEFAULT_RULES
    )
    sharded = jax.device_put(params, shardings)
    eng = JaxEngine(cfg, sharded, mesh=mesh, param_shardings=shardings)
    # Already laid out as `shardings`: the engine holds the very same arrays (no copy), and a
    # push of such arrays does not even call device_put (its per-leaf cost).
    assert all(a is b for a, b in zip(jax.tree.leaves(eng._params), jax.tree.leaves(sharded)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jax, "device_put", lambda *a, **k: pytest.fail("device_put called"))
        eng.update_weights(sharded, 1)
    assert all(a is b for a, b in zip(jax.tree.leaves(eng._params), jax.tree.leaves(sharded)))
    rng = np.random.default_rng(8)
    reqs = [Request(i, p, 2) for i, p in enumerate(_prompts(rng, cfg.vocab_size, [3, 10, 6]))]
    sp = SamplingParams(max_new_tokens=7, temperature=0.9, seed=1)
    got, want = eng.generate(reqs, sp), engine.generate(reqs, sp)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_bad_input_is_rejected_with_clear_errors(model, engine):
    cfg, params = model
    sp = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match="repeats prompt_id 5"):
        engine.generate([Request(5, (1,), 1), Request(5, (2,), 1)], sp)
    with pytest.raises(ValueError, match=r"prompt_id 9\) has token ids outside"):
        engine.generate([Request(9, (1, cfg.vocab_size), 1)], sp)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        engine.generate(
            [Request(1, (1,) * 10, 1)], SamplingParams(max_new_tokens=cfg.max_position_embeddings)
        )
    with pytest.raises(ValueError, match="JaxEngineConfig.max_batch"):
        JaxEngineConfig(min_batch=16, max_batch=8)
    assert engine.generate([Request(1, (1,), 0)], sp) == []
    closed = JaxEngine(cfg, params)
    closed.close()
    closed.close()
    with pytest.raises(RuntimeError, match="closed"):
        closed.generate([Request(1, (1,), 1)], sp)
