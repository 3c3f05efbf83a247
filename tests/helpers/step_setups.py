"""The sharpened tiny models, batches and layouts of the train-step tests
(tests/test_step_train_step.py, tests/test_step_on_policy.py). The models are built once per
session (the `step_setups` fixture in tests/conftest.py) so both modules share them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dynamo_jax.data.packing import RowLayout
from dynamo_jax.loop.assemble import RolloutBatch
from dynamo_jax.models.presets import get_preset
from dynamo_jax.models.qwen import forward, init_params, positions_from_mask
from dynamo_jax.sharding.mesh import MeshConfig, build_mesh

B, L = 8, 16
MODELS = ["tiny-qwen2", "tiny-qwen3"]
# The tests compile ~20 train steps; XLA's backend optimisation level 0 halves CPU compile time
# and does not change what the program computes.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def sharp_model(name):
    """(cfg, params as NumPy) with the unembedding scaled up (lm_head ×10, or a tied embedding
    ×4) so the policy is far from uniform: token entropies spread over ~[0.6, 5] nats instead of
    6.21 ± 0.005, where GC's (H_max − H)/(H_max − H_min) would amplify fp32 noise ~100× and make
    any tolerance meaningless."""
    cfg = get_preset(name)
    params = jax.tree.map(np.asarray, init_params(cfg, jax.random.key(1)))
    if cfg.tie_word_embeddings:
        params["embed"]["embedding"] = params["embed"]["embedding"] * 4.0
    else:
        params["lm_head"]["kernel"] = params["lm_head"]["kernel"] * 10.0
    return cfg, params


def make_batch(cfg, params, seed=0):
    """Prompt (5 tokens) + response of varying length, right padding, per-sequence advantages;
    old log-probs near the current ones (so some ratios clip and most do not)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(9, L + 1, B)
    mask = (np.arange(L)[None] < lengths[:, None]).astype(np.int32)
    tokens = rng.integers(1, cfg.vocab_size, (B, L)).astype(np.int32) * mask
    positions = np.asarray(positions_from_mask(mask))
    loss_mask = mask.astype(np.float32)
    loss_mask[:, :5] = 0.0
    temperature = np.float32(0.7)
    logits = forward(params, cfg, tokens, positions, mask)
    logpi = np.asarray(jax.nn.log_softmax(logits / temperature, axis=-1))
    logp = np.pad(
        np.take_along_axis(logpi[:, :-1], tokens[:, 1:, None], -1)[..., 0], ((0, 0), (1, 0))
    )
    return dict(
        tokens=tokens,
        positions=positions,
        segment_ids=mask,  # one sequence per row
        loss_mask=loss_mask,
        advantages=rng.normal(size=B).astype(np.float32),
        old_logp=(logp + 0.15 * rng.normal(size=(B, L))).astype(np.float32),
        sequence_index=np.broadcast_to(np.arange(B, dtype=np.int32)[:, None], (B, L)).copy(),
        temperature=temperature,
        on_policy=np.float32(0.0),  # the update reads old_logp
    )


def sub_mesh(shape):
    return build_mesh(MeshConfig(shape=shape), jax.devices()[: int(np.prod(shape))])


# The same sequences as one padded row each (one micro-batch) and packed into rows of 16 slots in
# micro-batches of 4 rows: the packed plan fills 3 micro-batches' worth of rows, rounded up to 4,
# so the step also meets a padding micro-batch (skipped) and runs the statistics pre-pass.
N_SEQ, MAX_LEN = 16, 16
PADDED = RowLayout(row_len=MAX_LEN, packing=False, micro_rows=N_SEQ, max_sequences=N_SEQ)
PACKED = RowLayout(row_len=16, packing=True, micro_rows=4, max_sequences=N_SEQ)


def make_rollouts(cfg, params, seed=2):
    """A RolloutBatch of N_SEQ sequences: prompts of 2-5 tokens, responses of 1 to
    MAX_LEN - prompt tokens, row 5 an invalid (empty) row, random advantages, and old log-probs
    near the policy's own (full softmax at T = 0.7)."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(2, 6, N_SEQ)
    response = rng.integers(1, MAX_LEN - prompt + 1)
    length = prompt + response
    length[5] = 0
    tokens = rng.integers(1, cfg.vocab_size, (N_SEQ, MAX_LEN))
    return rollouts_from_tokens(cfg, params, tokens, prompt, length, np.arange(N_SEQ) // 4, rng)


def rollouts_from_tokens(cfg, params, tokens, prompt_len, length, prompt_id, rng):
    """(RolloutBatch, log π, H) of rows of `tokens` holding a prompt of `prompt_len` tokens then
    its response, `length` real tokens in all (0: an invalid row): random rewards and
    advantages, and old log-probs near the policy's own (full softmax at T = 0.7)."""
    rows, width = tokens.shape
    slots = np.arange(width)[None]
    mask = (slots < length[:, None]).astype(np.int32)
    tokens = (tokens * mask).astype(np.int32)
    positions = np.asarray(positions_from_mask(mask))
    loss_mask = ((slots >= prompt_len[:, None]) & (mask > 0)).astype(np.float32)
    logits = forward(params, cfg, tokens, positions, mask)
    logpi = np.asarray(jax.nn.log_softmax(logits / 0.7, axis=-1), np.float64)
    logp = np.take_along_axis(logpi[:, :-1], tokens[:, 1:, None], -1)[..., 0]
    ent = -(np.exp(logpi) * logpi).sum(-1)[:, :-1]
    shift = lambda x: np.pad(x, ((0, 0), (1, 0)))  # token t is scored by slot t - 1
    old = (shift(logp) + 0.15 * rng.normal(size=(rows, width))) * loss_mask
    valid = length > 0
    batch = RolloutBatch(
        tokens=tokens,
        positions=positions,
        attention_mask=mask,
        loss_mask=loss_mask,
        engine_logp=np.zeros_like(loss_mask),
        valid=valid,
        prompt_id=np.where(valid, prompt_id, -1),
        response_len=np.where(valid, length - prompt_len, 0).astype(np.int32),
        stopped=valid,
        rewards=rng.integers(0, 2, rows).astype(np.float32),
        advantages=(rng.normal(size=rows) * valid).astype(np.float32),
        temperature=0.7,
        old_logp=old.astype(np.float32),
    )
    return batch, shift(logp), shift(ent)


def grad_recorder() -> optax.GradientTransformation:
    """An optimizer that applies nothing and keeps the last gradient as its state, so a step's
    gradient is read exactly (params − SGD(1)'s new params rounds at the parameters' ulp)."""
    return optax.GradientTransformation(
        lambda params: jax.tree.map(jnp.zeros_like, params),
        lambda grads, state, params=None: (jax.tree.map(jnp.zeros_like, grads), grads),
    )
