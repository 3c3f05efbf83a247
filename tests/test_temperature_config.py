"""TemperatureConfig validation: each bad field is rejected by name; a schedule owns its keys."""

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
        ({"mode": "e3", "vocab_size": 9, "init_steps": 0}, "init_steps"),
        ({"mode": "e3", "vocab_size": 9, "eta": 1.0}, "eta"),
        ({"mode": "e3", "vocab_size": 9, "eta": -0.1}, "eta"),
        ({"mode": "e3", "vocab_size": 9, "anneal_start_frac": 1.0}, "anneal_start_frac"),
        ({"mode": "e3"}, "vocab_size"),
        ({"mode": "e3", "vocab_size": 0}, "vocab_size"),
        ({"mode": "e3", "vocab_size": 1}, "vocab_size"),
        ({"anneal": True, "total_steps": 10}, "anneal: a setting of temperature schedule 'e3'"),
        ({"mode": "e3", "vocab_size": 100, "anneal": True}, "total_steps"),
    ],
)
def test_temperature_config_rejects(kwargs, field):
    with pytest.raises(ValueError, match=f"TemperatureConfig.{field}"):  # noqa: RUF043
        TemperatureConfig(**kwargs)


def test_anneal_start_step_floors_without_float_error():
    # 0.6 · 10 evaluates to 6.000000000000001 and 0.7 · 10 to 7.000000000000001; both are ⌊·⌋ = 6, 7.
    cfg = TemperatureConfig(mode="e3", vocab_size=10, anneal=True, total_steps=10)
    assert cfg.settings.anneal_start_step(cfg.total_steps) == 6
    cfg = TemperatureConfig(
        mode="e3", vocab_size=10, anneal=True, total_steps=7, anneal_start_frac=0.6
    )
    assert cfg.settings.anneal_start_step(cfg.total_steps) == 4  # ⌊4.2⌋


def test_vocab_size_and_total_steps_are_derived_not_set():
    """`temperature.vocab_size` / `total_steps` come from `model.vocab_size` / `train.steps`;
    setting one is refused in one line naming its source (config.DERIVED), unless it holds the
    derived value or None (an older run's config.json)."""
    from configs import base, tiny
    from dynamo_jax.config import from_config_dict, section_fields
    from dynamo_jax.errors import ConfigError

    assert {"vocab_size", "total_steps"}.isdisjoint(section_fields("temperature"))
    config = tiny.get_config("method=e3")
    config.train.steps = 7
    run = from_config_dict(config)
    assert (run.temperature.vocab_size, run.temperature.total_steps) == (32, 7)
    raw = config.to_dict()
    raw["temperature"].update(vocab_size=32, total_steps=None)  # the derived value, or None
    assert from_config_dict(raw) == run
    raw["temperature"]["total_steps"] = 100
    with pytest.raises(ConfigError) as err:
        from_config_dict(raw)
    assert str(err.value) == (
        "config.temperature.total_steps is derived from config.train.steps; remove it "
        "(it holds 100, train.steps is 7)"
    )
    with pytest.raises(ConfigError, match="^config.temperature.vocab_size is derived from "
                       "config.model.vocab_size; remove it$"):  # fmt: skip
        base.temperature("e3", vocab_size=32)  # the config files' builder
