"""Loss variants are records in one table: the built-in ones are registered, and a new baseline
is added from outside the package (here, a test-only toy) and runs through the real jitted step.

The toy variant ("toy_sign", defined only in this file, following docs/design.md's recipe: one
`register(...)` and nothing else): sequence advantage A = sign(R − 0.5) (+1 for a correct
response, −1 for a wrong one), token advantage Â = A · (1 + s · noise) with the step's per-token
U[0, 1) noise and its own config key s (`loss.toy_noise_scale`, its settings record; preset 0.5),
an unclipped token loss −Â · r, and one statistic of its own (`mean_noise`, the mini-batch's mean
noise, reported as a metric through an extra loss term of weight 0): neither is a field of
`LossConfig` or `ModStats`.
Oracle: at the first update old_logp equals the step's own log-probs, so r = 1 and the loss is
−mean over trained tokens of A · (1 + s · noise), evaluated in float64 NumPy with the noise the step
draws (its documented key: the seed folded with the noise stream, then the update counter; each
token's draw then folds in its sequence's index in the mini-batch and its position).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dynamo_jax.data.packing import RowLayout
from dynamo_jax.losses import (
    BASELINES,
    LossConfig,
    LossVariant,
    build_loss_fn,
    minibatch_stats,
    register,
    registry,
    sequence_advantages,
)
from dynamo_jax.losses.batch import as_mask, masked_mean
from dynamo_jax.models.presets import get_preset
from dynamo_jax.models.qwen import init_params
from dynamo_jax.sharding.mesh import MeshConfig, build_mesh
from dynamo_jax.sharding.rules import DEFAULT_RULES
from dynamo_jax.step.forward import make_logprob_fn
from dynamo_jax.step.state import train_state_from_params
from dynamo_jax.step.train_step import NOISE_STREAM, make_train_step

TOY = "toy_sign"
SCALE = 0.5  # the toy's preset noise scale


@dataclasses.dataclass(frozen=True)
class ToySettings:
    """The toy variant's own config key (`loss.toy_noise_scale`)."""

    toy_noise_scale: float = 1.0

    def __post_init__(self):
        if not self.toy_noise_scale >= 0:
            raise ValueError(f"LossConfig.toy_noise_scale must be >= 0, got {self.toy_noise_scale}")


def _toy_sequence_advantages(cfg, rewards_B, group_ids_B, num_groups, valid_B):
    adv = jnp.where(jnp.asarray(rewards_B) > 0.5, 1.0, -1.0)
    return adv if valid_B is None else jnp.where(valid_B, adv, 0.0)


def _toy_token_advantages(batch, stats, cfg):
    ones = jnp.ones_like(batch.adv, dtype=jnp.float32)
    return batch.adv * (1.0 + cfg.settings.toy_noise_scale * batch.noise), ones, ones


def _toy_token_loss(batch, stats, adv_hat, r, log_r, cfg):
    return -adv_hat * r


def _toy_statistics(batch, n_tokens, cfg):
    return {"mean_noise": masked_mean(batch.noise, as_mask(batch.mask))}


def _toy_extra(batch, mask, stats, cfg, aggregate):
    return "mean_noise", stats.mean_noise, 0.0


@pytest.fixture
def toy_variant():
    variant = register(
        LossVariant(
            TOY,
            "a test-only toy",
            dict(clip_low=0.2, clip_high=0.2, dual_clip=None, toy_noise_scale=SCALE),
            settings=ToySettings,
            sequence_advantages=_toy_sequence_advantages,
            token_advantages=_toy_token_advantages,
            token_loss=_toy_token_loss,
            statistics=_toy_statistics,
            extra_loss=_toy_extra,
            needs_noise=True,
        )
    )
    yield variant
    registry.unregister(TOY)


def test_builtin_variants_are_registered_with_their_presets():
    assert BASELINES == (
        "grpo",
        "dynamo",
        "clip_higher",
        "entropy_loss",
        "fork_tokens",
        "entropy_adv",
        "clip_cov",
        "kl_cov",
        "w_reinforce",
    )
    for name in BASELINES:
        variant = registry.get(name)
        assert variant.name == name and variant.source
        assert LossConfig.preset(name).variant == name
    assert registry.get("clip_cov").needs_noise
    assert registry.get("kl_cov").needs_noise  # breaks ties at its covariance cut
    assert not any(
        registry.get(n).needs_noise for n in BASELINES if n not in ("clip_cov", "kl_cov")
    )
    with pytest.raises(ValueError, match="already registered"):
        register(LossVariant("grpo", "a second GRPO"))
    with pytest.raises(ValueError, match="unknown loss variant 'dapo'"):
        registry.get("dapo")


def test_unregistered_names_are_refused_until_registered(toy_variant):
    cfg = LossConfig.preset(TOY)
    assert cfg.variant == TOY and cfg.clip_high == 0.2 and not cfg.needs_k
    assert cfg.settings == ToySettings(SCALE)
    registry.unregister(TOY)
    with pytest.raises(ValueError, match="LossConfig.variant"):
        LossConfig.preset(TOY)
    register(toy_variant)


def test_the_toy_owns_its_config_key_and_statistic(toy_variant):
    """The registered toy's key is a key of the `loss` section (config files, overrides, the
    saved config), validated by its record; its statistic is read by name. LossConfig and
    ModStats have neither as a field."""
    from dynamo_jax.config import build_section, section_fields
    from dynamo_jax.errors import ConfigError
    from dynamo_jax.losses import ModStats

    assert "toy_noise_scale" not in {f.name for f in dataclasses.fields(LossConfig)}
    assert "mean_noise" not in ModStats._fields
    assert section_fields("loss")["toy_noise_scale"] == (1.0, float)
    cfg = build_section("loss", {"variant": TOY, "toy_noise_scale": 2.0})
    assert cfg.settings.toy_noise_scale == 2.0 and cfg.flat()["toy_noise_scale"] == 2.0
    with pytest.raises(ConfigError, match="LossConfig.toy_noise_scale must be >= 0"):
        build_section("loss", {"variant": TOY, "toy_noise_scale": -1.0})
    with pytest.raises(ConfigError, match="a setting of loss variant 'toy_sign' only"):
        build_section("loss", {"variant": "grpo", "toy_noise_scale": 2.0})
    with pytest.raises(ValueError, match="'clip_low' belongs to the section"):
        register(LossVariant("toy_clash", "a clash", settings=_ClashSettings))
    stats = minibatch_stats(_toy_batch(np.random.default_rng(2)), LossConfig.preset(TOY))
    assert set(stats.own) == {"mean_noise"}
    with pytest.raises(AttributeError, match="no statistic 'h_min'"):
        getattr(stats, "h_min")  # noqa: B009 (the attribute lookup is what is tested)


@dataclasses.dataclass(frozen=True)
class _ClashSettings:
    clip_low: float = 0.1  # a shared key of the loss section: refused


def _toy_batch(rng, rows=3, length=5):
    from dynamo_jax.losses import TokenBatch

    f32 = lambda x: jnp.asarray(x, jnp.float32)
    logp = rng.normal(-2.0, 0.5, (rows, length))
    old = logp + rng.normal(0.0, 0.1, (rows, length))
    mask = rng.random((rows, length)) < 0.7
    adv = np.array([1.0, -1.0, 1.0])[:, None] * np.ones((1, length))
    noise = rng.random((rows, length))
    return TokenBatch(
        f32(logp), f32(old), f32(np.ones_like(logp)), f32(adv), mask, noise=f32(noise)
    )


def test_toy_variant_sequence_advantages(toy_variant):
    rewards = np.array([1.0, 0.0, 0.0, 1.0], np.float32)
    valid = np.array([True, True, True, False])
    adv = sequence_advantages(LossConfig.preset(TOY), rewards, np.zeros(4), valid_B=valid)
    np.testing.assert_array_equal(np.asarray(adv), [1.0, -1.0, -1.0, 0.0])


def test_toy_variant_runs_through_the_real_jitted_step(toy_variant):
    cfg = get_preset("tiny-qwen3")
    params = jax.tree.map(np.asarray, init_params(cfg, jax.random.key(0)))
    mesh = build_mesh(MeshConfig(shape=(1, 1, 1)), jax.devices()[:1])
    rows, length = 4, 12
    rng = np.random.default_rng(0)
    # Rows 0 and 1 hold one sequence each; row 2 packs sequences 2 (7 slots) and 3 (5 slots),
    # whose positions restart at 0; row 3 is empty.
    seq_of_slot = np.array([[0] * length, [1] * length, [2] * 7 + [3] * 5, [-1] * length])
    position = np.array([range(length), range(length), [*range(7), *range(5)], [0] * length])
    batch = dict(
        tokens=rng.integers(1, cfg.vocab_size, (rows, length)).astype(np.int32),
        positions=position.astype(np.int32),
        segment_ids=np.array([[1] * length, [1] * length, [1] * 7 + [2] * 5, [0] * length]),
        loss_mask=((position >= 3) & (seq_of_slot >= 0)).astype(np.float32),
        sequence_index=np.maximum(seq_of_slot, 0).astype(np.int32),
        temperature=np.float32(1.0),
        on_policy=np.float32(0.0),
    )
    rewards = np.array([1.0, 0.0, 1.0, 0.0], np.float32)
    loss_cfg = LossConfig.preset(TOY)
    adv = sequence_advantages(loss_cfg, rewards, np.arange(rows), valid_B=np.ones(rows, bool))
    batch["advantages"] = np.where(seq_of_slot >= 0, np.asarray(adv)[seq_of_slot], 0.0).astype(
        np.float32
    )
    layout = RowLayout(row_len=length, packing=True, micro_rows=rows, max_sequences=rows)
    logprob = make_logprob_fn(cfg, mesh, DEFAULT_RULES, layout)
    batch["old_logp"] = np.asarray(logprob(params, batch)[0])

    opt = optax.sgd(1e-2)
    step, state_sh, batch_sh = make_train_step(
        cfg, loss_cfg, opt, mesh, DEFAULT_RULES, batch_size=rows, seed=3
    )
    assert "noise" not in batch_sh  # drawn on the device, not fed by the loop
    state = train_state_from_params(params, opt, state_sh)
    new_state, metrics = step(state, {k: batch[k] for k in batch_sh})
    metrics = {k: float(v) for k, v in metrics.items()}

    # The step's noise: `seed` folded with the noise stream, then with the update counter (0),
    # then per token with its sequence's index in the mini-batch and its position in it.
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(3), NOISE_STREAM), 0)
    noise = np.zeros((rows, length))
    for r, t in np.ndindex(rows, length):
        s, p = int(batch["sequence_index"][r, t]), int(batch["positions"][r, t])
        noise[r, t] = jax.random.uniform(jax.random.fold_in(jax.random.fold_in(key, s), p))
    # r = 1 at the first update (old_logp is this policy's), so the loss is
    # −Σ_t A_t (1 + s · noise_t) / n_tokens over the trained tokens.
    trained = batch["loss_mask"] > 0
    a_bxl = batch["advantages"].astype(np.float64)
    want = -np.sum(np.where(trained, a_bxl * (1.0 + SCALE * noise), 0.0)) / trained.sum()
    assert metrics["tokens"] == trained.sum() and metrics["sequences"] == 4
    np.testing.assert_allclose(metrics["loss"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["mean_noise"], noise[trained].mean(), rtol=1e-5)
    assert abs(want) > 1e-3  # the noise made the +1 and −1 rows unequal: a non-trivial value
    changed = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != b)), new_state.params, params)
    assert any(jax.tree.leaves(changed))  # the toy loss produced a gradient that was applied

    # The same noise comes back at the same update counter: a second build with the same seed
    # gives the same loss; another seed gives another draw.
    again = make_train_step(cfg, loss_cfg, opt, mesh, DEFAULT_RULES, batch_size=rows, seed=3)
    other = make_train_step(cfg, loss_cfg, opt, mesh, DEFAULT_RULES, batch_size=rows, seed=4)
    fresh = lambda: train_state_from_params(params, opt, state_sh)
    loss_again = float(again.fn(fresh(), {k: batch[k] for k in batch_sh})[1]["loss"])
    loss_other = float(other.fn(fresh(), {k: batch[k] for k in batch_sh})[1]["loss"])
    assert loss_again == metrics["loss"] and loss_other != metrics["loss"]


def test_toy_loss_against_a_float64_reference(toy_variant):
    """The toy record's pieces assembled by `build_loss_fn`, against NumPy float64."""
    rng = np.random.default_rng(1)
    rows, length = 3, 5
    logp = rng.normal(-2.0, 0.5, (rows, length))
    old = logp + rng.normal(0.0, 0.1, (rows, length))
    mask = rng.random((rows, length)) < 0.7
    adv = np.array([1.0, -1.0, 1.0])[:, None] * np.ones((1, length))
    noise = rng.random((rows, length))
    from dynamo_jax.losses import TokenBatch

    f32 = lambda x: jnp.asarray(x, jnp.float32)
    tb = TokenBatch(f32(logp), f32(old), f32(np.ones_like(logp)), f32(adv), mask, noise=f32(noise))
    cfg = LossConfig.preset(TOY)
    loss, metrics = build_loss_fn(cfg)(tb, minibatch_stats(tb, cfg))
    r = np.exp(logp - old)
    want = np.sum(np.where(mask, -adv * (1.0 + SCALE * noise) * r, 0.0)) / mask.sum()
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["mean_noise"]), noise[mask].mean(), rtol=1e-5)
