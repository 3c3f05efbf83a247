"""The embedded engine's speed changes keep its numbers: the prompt forward shared by a prompt's
samples gives the same completions (tokens, log-probs, finish reasons) as one forward per row,
the previous implementation, kept callable as `JaxEngine(share_prefill=False)`."""

import jax
import numpy as np
import pytest

from dynamo_jax.models.presets import get_preset
from dynamo_jax.models.qwen import init_params
from dynamo_jax.rollout import buckets
from dynamo_jax.rollout.jax_engine import JaxEngine, JaxEngineConfig
from dynamo_jax.rollout.protocol import Request, SamplingParams


@pytest.fixture(scope="module")
def model():
    cfg = get_preset("tiny-qwen2")
    params = init_params(cfg, jax.random.key(1))
    # Sharpened logits (a trained model's regime): draws depend on every logit's value.
    params["final_norm"]["scale"] = params["final_norm"]["scale"] * 40.0
    return cfg, params


def _requests(cfg, seed=0):
    rng = np.random.default_rng(seed)
    lengths, counts = [3, 9, 5, 14, 9, 1], [4, 3, 1, 6, 2, 5]
    return [
        Request(100 + i, tuple(int(t) for t in rng.integers(0, cfg.vocab_size, n)), c)
        for i, (n, c) in enumerate(zip(lengths, counts))
    ]


def test_distinct_prompts_maps_every_row_to_its_prompt():
    reqs = [Request(7, (1, 2), 2), Request(3, (1, 2), 1), Request(5, (4,), 3)]
    rows = buckets.expand_requests(reqs, 10)
    prompts, of_row = buckets.distinct_prompts(rows)
    assert [prompts[u] for u in of_row] == [r.prompt for r in rows]
    # Rows sort by (length, id): prompt 5's three rows, then 3's one, then 7's two. Keyed by
    # prompt id: requests 7 and 3 have equal tokens but stay two prompts.
    assert prompts == [(4,), (1, 2), (1, 2)] and of_row == [0, 0, 0, 1, 2, 2]


@pytest.mark.parametrize(
    "sp",
    [
        SamplingParams(max_new_tokens=12, seed=3),
        SamplingParams(max_new_tokens=12, seed=4, temperature=0.7, top_k=5, top_p=0.9),
        SamplingParams(max_new_tokens=9, temperature=0.0),
    ],
    ids=["plain", "top_k_top_p", "greedy"],
)
@pytest.mark.parametrize("max_batch", [256, 8], ids=["one_batch", "split_batches"])
def test_shared_prefill_equals_one_prefill_per_row(model, sp, max_batch):
    cfg, params = model
    reqs = _requests(cfg)
    config = JaxEngineConfig(min_batch=4, decode_chunk=3, max_batch=max_batch)
    per_row = JaxEngine(cfg, params, config, share_prefill=False).generate(reqs, sp)
    # Stop on a token the free run draws early in some rows, so stops and compaction occur.
    stops = tuple({int(c.token_ids[2]) for c in per_row[::5]})
    sp = SamplingParams(**{**sp.__dict__, "stop_token_ids": stops})
    old = JaxEngine(cfg, params, config, share_prefill=False).generate(reqs, sp)
    shared_engine = JaxEngine(cfg, params, config)
    new = shared_engine.generate(reqs, sp)
    assert [(c.prompt_id, c.sample_index) for c in new] == [
        (c.prompt_id, c.sample_index) for c in old
    ]
    for a, b in zip(new, old):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        # A prompt's forward runs in a batch of distinct prompts instead of one of rows: XLA may
        # block the matmuls differently, so the log-probs are equal to float32 rounding only.
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=2e-5)
        assert a.finish_reason == b.finish_reason
    assert {c.finish_reason for c in new} == {"stop", "length"}
