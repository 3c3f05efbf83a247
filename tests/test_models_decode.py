"""KV-cache decoding against transformers' greedy generate and against the full forward."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hf_fixtures import make_tiny_hf_model

from dynamo_jax.models import decode, hf_io, qwen
from dynamo_jax.models.config import ModelConfig

# Left-padded prompts of lengths 3, 6 and 5.
PROMPTS = np.array([[0, 0, 0, 5, 6, 7], [1, 2, 3, 4, 5, 9], [0, 11, 12, 13, 14, 15]])
PROMPT_MASK = (np.arange(6)[None, :] >= np.array([3, 0, 1])[:, None]).astype(np.int32)
NEW = 6


# Decoding runs the layers unrolled either way (Transformer.extend); with scanned parameters it
# slices each layer's weights out of the stack, so both parameter layouts are checked.
@pytest.fixture(
    scope="module", params=[("qwen2", True), ("qwen3", True), ("qwen3", False)], ids=str
)
def model_and_params(request):
    family, scan = request.param
    model = make_tiny_hf_model(family, tie=family == "qwen3", seed=7)
    cfg = ModelConfig.from_hf_config(model.config.to_dict()).replace(scan_layers=scan)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return model, cfg, hf_io.from_hf_tensors(sd, cfg)


def test_greedy_decode_matches_transformers_generate(model_and_params):
    model, cfg, params = model_and_params
    ours = np.asarray(decode.greedy_generate(params, cfg, PROMPTS, PROMPT_MASK, NEW))
    model.generation_config.eos_token_id = None  # never stop early: compare all NEW tokens
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.as_tensor(PROMPTS),
            attention_mask=torch.as_tensor(PROMPT_MASK),
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            do_sample=False,
        )
    theirs = out[:, PROMPTS.shape[1] :].numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert len(np.unique(ours)) > 3  # a non-degenerate continuation


def test_cached_logits_equal_full_forward_at_every_position(model_and_params):
    _, cfg, params = model_and_params
    rng = np.random.default_rng(0)
    cont = rng.integers(1, cfg.vocab_size, size=(PROMPTS.shape[0], NEW)).astype(np.int32)
    tokens = np.concatenate([PROMPTS, cont], axis=1)
    mask = np.concatenate([PROMPT_MASK, np.ones_like(cont)], axis=1)
    full = np.asarray(qwen.forward_jit(params, cfg, tokens, qwen.positions_from_mask(mask), mask))

    # Same cache size as greedy_generate's, so the jitted functions are reused.
    cache = decode.init_cache(cfg, PROMPTS.shape[0], tokens.shape[1])
    logits, cache = decode.prefill_jit(params, cfg, PROMPTS, PROMPT_MASK, cache)
    got = [np.asarray(logits)]
    for t in range(NEW - 1):
        logits, cache = decode.decode_step_jit(params, cfg, cont[:, t], cache)
        got.append(np.asarray(logits))
    got = np.stack(got, axis=1)  # logits predicting tokens P .. P+NEW-1
    expected = full[:, PROMPTS.shape[1] - 1 : -1]
    assert got.dtype == np.float32 and np.abs(expected).max() > 1.0
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=0)
    assert int(cache.index) == tokens.shape[1] - 1
    np.testing.assert_array_equal(cache.next_pos_B, mask.sum(1) - 1)


def test_prefill_then_steps_equals_one_prefill(model_and_params):
    """A shorter prefill continued by decode steps lands on the same logits (slots and
    positions carry over between calls)."""
    _, cfg, params = model_and_params
    size = PROMPTS.shape[1] + NEW
    one, _ = decode.prefill_jit(params, cfg, PROMPTS, PROMPT_MASK, decode.init_cache(cfg, 3, size))
    cache = decode.init_cache(cfg, 3, size)
    logits, cache = decode.prefill_jit(params, cfg, PROMPTS[:, :4], PROMPT_MASK[:, :4], cache)
    for t in (4, 5):  # every row is real from column 3 on
        logits, cache = decode.decode_step_jit(params, cfg, PROMPTS[:, t], cache)
    np.testing.assert_allclose(logits, one, atol=2e-5, rtol=0)


def test_cache_shapes_and_errors():
    cfg = ModelConfig("qwen3", 64, 32, 64, 3, 4, 2, head_dim=16)
    cache = decode.init_cache(cfg, 2, 10, dtype=jnp.bfloat16)
    assert len(cache.k) == len(cache.v) == 3  # one array per layer
    assert cache.k[0].shape == (2, 2, 16, 10) and cache.k[0].dtype == jnp.bfloat16
    assert cache.v[0].shape == (2, 2, 10, 16) and cache.v[0].dtype == jnp.bfloat16
    assert cache.max_len == 10
    params = None  # the checks fire before any parameter is touched
    with pytest.raises(ValueError, match="prompt length 11 > cache max_len 10"):
        decode.prefill(params, cfg, np.ones((2, 11), np.int32), np.ones((2, 11), np.int32), cache)
    with pytest.raises(ValueError, match="batch 3 != cache batch 2"):
        decode.prefill(params, cfg, np.ones((3, 4), np.int32), np.ones((3, 4), np.int32), cache)


def test_smoke_entry_point_runs(capsys):
    from dynamo_jax.models import smoke

    text = smoke.main(["--max_new_tokens", "3"])
    assert isinstance(text, str)
    assert "generated ids" in capsys.readouterr().out
