"""TemperatureScheduler: E3 Eq. 4 on a given entropy sequence, Eq. 5's cosine target, a closed
loop where entropy responds to temperature like a softmax over fixed logits, and checkpointing."""

import dataclasses
import math

import numpy as np
import pytest

from dynamo_jax.temperature import TemperatureConfig, TemperatureScheduler, registry

V = 512


def _e3(**kw):
    return TemperatureScheduler(TemperatureConfig(mode="e3", vocab_size=V, **kw))


def test_fixed_mode_never_moves():
    s = TemperatureScheduler(TemperatureConfig(mode="fixed", initial=0.8))
    for t, h in enumerate([2.0, 0.5, 5.0]):
        assert s.update(h, t) == 0.8
    assert s.current() == 0.8


def test_first_update_by_hand():
    # init_steps = 2: H_init = (2.0 + 2.2)/2 = 2.1, τ stays 1.0 for the init batches.
    # Batch 2 has H = 1.8: τ = 1·(1 + 1·ln(2.1/1.8)/(ln 1000 + ln ln 1000))
    #   = 1 + 0.1541507/(6.9077553 + 1.9326447) = 1 + 0.1541507/8.8404000 = 1.0174370.
    s = TemperatureScheduler(TemperatureConfig(mode="e3", vocab_size=1000, init_steps=2))
    assert s.update(2.0, 0) == 1.0 and s.update(2.2, 1) == 1.0
    assert s.h_init == pytest.approx(2.1)
    assert s.update(1.8, 2) == pytest.approx(1.0174370, abs=1e-7)


def test_eq4_on_an_entropy_sequence():
    # Float64 reference of Eq. 4, written from the formula, on an arbitrary entropy sequence.
    entropies = [1.2, 1.0, 0.9, 1.4, 1.1, 0.7, 0.95, 1.3, 1.25]
    s = _e3(initial=0.9, temperature_min=0.01, temperature_max=10.0)
    tau, h_init = 0.9, entropies[0]
    denom = math.log(V) + math.log(math.log(V))
    for t, h in enumerate(entropies):
        got = s.update(h, t)
        if t > 0:
            tau = tau * (1 + tau * math.log(h_init / h) / denom)
        assert got == pytest.approx(tau, rel=1e-12), t
        if t == 1:  # entropy 1.0 below the target 1.2 raised τ
            assert got > 0.9


def test_temperature_is_clamped():
    s = _e3(temperature_min=0.5, temperature_max=1.5)
    s.update(1.0, 0)
    assert s.update(1e6, 1) == 0.5  # Eq. 4 alone would give a negative temperature
    assert s.update(1e-9, 2) == pytest.approx(
        0.5 * (1 + 0.5 * math.log(1e9) / (math.log(V) + math.log(math.log(V))))
    )
    for t in range(3, 40):
        s.update(1e-9, t)
    assert s.current() == 1.5


def test_cosine_target():
    # t_max = 100, t_anneal = ⌊0.6·100⌋ = 60, η = 0.9, H_init = 2:
    #   t ≤ 60: 2;  t = 70: 2·(.9 + .1·½(1 + cos(π/4))) = 2·0.98535534;  t = 80: 2·0.95;
    #   t = 100 (and after): 2·0.9.
    s = _e3(anneal=True, total_steps=100)
    s.update(2.0, 0)
    expected = {0: 2.0, 60: 2.0, 70: 2 * 0.98535534, 80: 1.9, 100: 1.8, 130: 1.8}
    for t, h in expected.items():
        assert s.target_entropy(t) == pytest.approx(h, abs=1e-8), t
    targets = [s.target_entropy(t) for t in range(60, 101)]
    assert all(a >= b for a, b in zip(targets, targets[1:]))  # monotone along the cosine


def _softmax_entropy(logits, tau):
    z = logits / tau
    z = z - z.max(-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(-1, keepdims=True)
    return float(np.mean(-(p * np.log(p)).sum(-1)))


def _closed_loop(scheduler, steps, drift):
    """The policy sharpens (logits × (1 + drift·t)); entropy is measured at the scheduled τ."""
    logits = np.random.default_rng(0).normal(size=(8, V)) * 3.0
    out = []
    for t in range(steps):
        h = _softmax_entropy(logits * (1 + drift * t), scheduler.current())
        out.append(h)
        scheduler.update(h, t)
    return np.array(out), logits


def test_closed_loop_holds_entropy_near_h_init():
    steps, drift = 150, 0.003
    s = _e3(initial=0.7, temperature_max=3.0)
    h, logits = _closed_loop(s, steps, drift)
    h_init = h[0]
    # Without the scheduler the sharpening policy loses a third of its entropy ...
    assert _softmax_entropy(logits * (1 + drift * (steps - 1)), 0.7) < 0.7 * h_init
    # ... with it, entropy stays within 3.5% of H_init all along, by raising τ.
    assert np.max(np.abs(h / h_init - 1)) < 0.035
    assert s.current() > 0.95


def test_closed_loop_follows_the_annealed_target():
    steps = 150
    s = _e3(initial=0.7, temperature_max=3.0, anneal=True, total_steps=steps)
    h, _ = _closed_loop(s, steps, 0.003)
    targets = np.array([s.target_entropy(t) for t in range(steps)])
    assert targets[-1] == pytest.approx(0.9 * h[0], rel=1e-3)  # ends near η·H_init
    assert np.max(np.abs(h / targets - 1)) < 0.035
    assert h[-1] / h[0] == pytest.approx(0.9, abs=0.02)


def test_state_dict_resumes_identically():
    entropies = [1.0, 0.9, 0.8, 1.1, 0.95, 0.85, 0.9, 1.05]
    a = _e3(init_steps=2, anneal=True, total_steps=8)
    for t, h in enumerate(entropies[:4]):
        a.update(h, t)
    b = _e3(init_steps=2, anneal=True, total_steps=8)
    b.load_state_dict({k: v.copy() for k, v in a.state_dict().items()})
    for t, h in enumerate(entropies[4:], start=4):
        assert a.update(h, t) == b.update(h, t)
    # Mid-initialisation state restores too.
    c = _e3(init_steps=3)
    c.update(1.0, 0)
    d = _e3(init_steps=3)
    d.load_state_dict(c.state_dict())
    d.update(2.0, 1)
    d.update(3.0, 2)
    assert d.h_init == pytest.approx(2.0)


def test_bad_updates_are_rejected():
    s = _e3()
    s.update(1.0, 5)
    with pytest.raises(ValueError, match="step 5 is not after the last step seen"):
        s.update(1.0, 5)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="mean_entropy at step 6 must be finite and > 0"):
            s.update(bad, 6)
    with pytest.raises(ValueError, match="missing \\['h_init'\\]"):
        s.load_state_dict({k: v for k, v in s.state_dict().items() if k != "h_init"})


# A toy schedule, registered from this test only (docs/design.md#adding-a-temperature-schedule):
# τ is multiplied by its own key `toy_factor` after every batch, within the clamp.
TOY = "toy_geometric"


@dataclasses.dataclass(frozen=True)
class ToySettings:
    toy_factor: float = 0.5

    def __post_init__(self):
        if not 0 < self.toy_factor:
            raise ValueError(f"TemperatureConfig.toy_factor must be > 0, got {self.toy_factor}")


def _toy_next(s, mean_entropy, step):
    cfg = s.cfg
    tau = s.temperature * cfg.settings.toy_factor
    return min(max(tau, cfg.temperature_min), cfg.temperature_max)


@pytest.fixture
def toy_schedule():
    schedule = registry.register(
        registry.TemperatureSchedule(
            TOY, "a test-only toy", settings=ToySettings, next_temperature=_toy_next
        )
    )
    yield schedule
    registry.unregister(TOY)


def test_a_toy_schedule_registered_from_outside_runs_with_its_own_key(toy_schedule):
    from configs import tiny
    from dynamo_jax.config import from_config_dict, section_fields
    from dynamo_jax.errors import ConfigError

    s = TemperatureScheduler(TemperatureConfig(mode=TOY, initial=1.6, toy_factor=0.25))
    assert [s.update(1.0, t) for t in range(3)] == [0.4, 0.1, 0.1]  # 1.6/4, /4, clamped at 0.1
    assert section_fields("temperature")["toy_factor"] == (0.5, float)
    config = tiny.get_config("method=grpo").to_dict()
    config["temperature"].update(mode=TOY, toy_factor=0.75)
    run = from_config_dict(config)
    assert run.temperature.settings == ToySettings(0.75)
    assert not run.temperature.reads_entropy  # no log-prob pass is kept for it
    config["temperature"]["toy_factor"] = -1.0
    with pytest.raises(ConfigError, match="TemperatureConfig.toy_factor must be > 0"):
        from_config_dict(config)
    with pytest.raises(ValueError, match="a setting of temperature schedule 'toy_geometric'"):
        TemperatureConfig(mode="fixed", toy_factor=0.75)
    registry.unregister(TOY)
    with pytest.raises(ValueError, match="TemperatureConfig.mode must be one of"):
        TemperatureConfig(mode=TOY)
    registry.register(toy_schedule)
