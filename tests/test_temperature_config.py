"""TemperatureConfig validation: each bad field is rejected by name."""

import pytest

from dynamo_jax.temperature import TemperatureConfig


def test_defaults_are_valid():
    TemperatureConfig()
    TemperatureConfig(mode="e3", vocab_size=151_936, anneal=True, total_steps=100)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"mode": "cosine"}, "mode"),
        ({"initial": 0.0}, "initial"),
        ({"initial": 3.0}, "initial"),  # outside the default clamp [0.1, 2.0]
        ({"temperature_min": 1.5, "temperature_max": 1.2, "initial": 1.3}, "temperature_min"),
        ({"init_steps": 0}, "init_steps"),
        ({"eta": 1.0}, "eta"),
        ({"eta": -0.1}, "eta"),
        ({"anneal_start_frac": 1.0}, "anneal_start_frac"),
        ({"mode": "e3"}, "vocab_size"),
        ({"mode": "e3", "vocab_size": 0}, "vocab_size"),
        ({"mode": "e3", "vocab_size": 1}, "vocab_size"),
        ({"anneal": True, "total_steps": 10}, "anneal"),
        ({"mode": "e3", "vocab_size": 100, "anneal": True}, "total_steps"),
    ],
)
def test_temperature_config_rejects(kwargs, field):
    with pytest.raises(ValueError, match=f"TemperatureConfig.{field}"):
        TemperatureConfig(**kwargs)


def test_anneal_start_step_floors_without_float_error():
    # 0.6 · 10 evaluates to 6.000000000000001 and 0.7 · 10 to 7.000000000000001; both are ⌊·⌋ = 6, 7.
    cfg = TemperatureConfig(mode="e3", vocab_size=10, anneal=True, total_steps=10)
    assert cfg.anneal_start_step == 6
    cfg = TemperatureConfig(
        mode="e3", vocab_size=10, anneal=True, total_steps=7, anneal_start_frac=0.6
    )
    assert cfg.anneal_start_step == 4  # ⌊4.2⌋
