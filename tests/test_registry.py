"""The one table shape of the extension points (dynamo_jax/registry.py): names, key ownership,
settings built from a flat section, and each flat section's shared keys stated once."""

import dataclasses

import pytest

from dynamo_jax.registry import NoSettings, Registry


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    settings: type = NoSettings


@dataclasses.dataclass(frozen=True)
class ASettings:
    a_size: int = 3

    def __post_init__(self):
        if self.a_size < 0:
            raise ValueError(f"Section.a_size must be >= 0, got {self.a_size}")


@dataclasses.dataclass(frozen=True)
class ClashSettings:
    a_size: int = 4


def test_names_keys_and_settings():
    table = Registry("toy kind", shared=("kind",))
    table.register(Spec("a", ASettings))
    table.register(Spec("b"))
    assert table.names() == ("a", "b") and "a" in table and table.owner("a_size") == "a"
    assert table.settings_defaults() == {"a_size": 3}
    with pytest.raises(ValueError, match="toy kind 'a' is already registered"):
        table.register(Spec("a"))
    with pytest.raises(ValueError, match="config key 'a_size' belongs to toy kind 'a'"):
        table.register(Spec("c", ClashSettings))
    with pytest.raises(ValueError, match=r"unknown toy kind 'z'; registered: \('a', 'b'\)"):
        table.get("z")
    assert table.build_settings("a", {"a_size": 5, "kind": "a"}, "Section") == ASettings(5)
    assert table.build_settings("b", {"a_size": 3}, "Section") == NoSettings()  # a's default
    with pytest.raises(ValueError, match="Section.a_size: a setting of toy kind 'a' only"):
        table.build_settings("b", {"a_size": 5}, "Section")
    with pytest.raises(ValueError, match="Section.a_size must be >= 0"):
        table.build_settings("a", {"a_size": -1}, "Section")
    table.unregister("a")
    assert table.names() == ("b",) and table.owner("a_size") is None


def test_each_flat_section_states_its_shared_keys_once():
    """The tables' `shared` (checked against each spec's keys at registration) are the
    sections' own fields."""
    from dynamo_jax.allocation import AllocationConfig
    from dynamo_jax.allocation import registry as allocation
    from dynamo_jax.losses import LossConfig
    from dynamo_jax.losses import registry as losses
    from dynamo_jax.temperature import TemperatureConfig
    from dynamo_jax.temperature import registry as temperature

    for cls, table in (
        (LossConfig, losses.VARIANTS),
        (AllocationConfig, allocation.POLICIES),
        (TemperatureConfig, temperature.SCHEDULES),
    ):
        fields = {f.name for f in dataclasses.fields(cls)} - {"settings"}
        assert table.shared == fields, cls.__name__
