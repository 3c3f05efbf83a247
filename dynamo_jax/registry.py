"""One shape for every extension point: a table of frozen specs, registered by name.

Loss variants (`losses/registry.py`), allocation policies (`allocation/registry.py`),
temperature schedules (`temperature/registry.py`) and model families (`models/families.py`) each
keep one `Registry`. A spec is a frozen dataclass with a `name`; where the extension point has
settings, the spec also owns `settings`: the frozen dataclass of its own config keys (their
defaults, and their validation in its `__post_init__`). The config section stays flat (the keys
of every registered spec sit beside the section's shared keys), so each key belongs to exactly
one spec, and `register` refuses a key that another spec (or the section itself) already has.

A spec is added with `register(spec)` (the built-in ones where the table is defined, a toy one
from a test) and looked up once, where the thing it describes is built; no module compares a
spec's name as a string.

This module imports nothing of the package (the math and model packages all use it).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar

S = TypeVar("S")


@dataclasses.dataclass(frozen=True)
class NoSettings:
    """The settings of a spec that has no config keys of its own."""


def settings_fields(spec: Any) -> dict[str, dataclasses.Field]:
    """The config keys `spec` owns: the init fields of its `settings` dataclass (none without)."""
    settings = getattr(spec, "settings", None)
    if settings is None:
        return {}
    return {f.name: f for f in dataclasses.fields(settings) if f.init}


def field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


class Registry(Generic[S]):
    """name → frozen spec, in registration order. `kind` names the table in errors; `shared`
    are the config section's own keys, which no spec's settings may reuse."""

    def __init__(self, kind: str, shared: Iterable[str] = ()):
        self.kind = kind
        self.shared = frozenset(shared)
        self._specs: dict[str, S] = {}

    def register(self, spec: S, *, replace: bool = False) -> S:
        """Add `spec`; a second spec under the same name, or a settings key another spec (or the
        section) already has, is an error."""
        name = spec.name
        if name in self._specs and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        for key in settings_fields(spec):
            owner = self.owner(key)
            if key in self.shared or (owner is not None and owner != name):
                where = "the section" if key in self.shared else f"{self.kind} {owner!r}"
                raise ValueError(f"{self.kind} {name!r}: config key {key!r} belongs to {where}")
        self._specs[name] = spec
        return spec

    def unregister(self, name: str) -> None:
        self._specs.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self._specs)

    def specs(self) -> tuple[S, ...]:
        return tuple(self._specs.values())

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def get(self, name: str) -> S:
        try:
            return self._specs[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {self.names()}") from None

    def owner(self, key: str) -> str | None:
        """The spec whose settings hold config key `key`, if any."""
        for name, spec in self._specs.items():
            if key in settings_fields(spec):
                return name
        return None

    def settings_defaults(self) -> dict[str, Any]:
        """Every registered spec's config keys with their defaults (the section's flat keys)."""
        out: dict[str, Any] = {}
        for spec in self._specs.values():
            out.update({k: field_default(f) for k, f in settings_fields(spec).items()})
        return out

    def build_settings(self, name: str, values: Mapping[str, Any], where: str) -> Any:
        """Spec `name`'s settings from the flat `values` of its section (`where`, e.g.
        "LossConfig"), the keys it does not set at their defaults. A key of another spec may
        only hold its default: set, it would be silently ignored."""
        spec = self.get(name)
        own = settings_fields(spec)
        for key, value in values.items():
            owner = self.owner(key)
            if owner is None or owner == name:
                continue
            default = field_default(settings_fields(self.get(owner))[key])
            if value != default:
                raise ValueError(
                    f"{where}.{key}: a setting of {self.kind} {owner!r} only; with {name!r} it "
                    f"must keep its default {default!r}, got {value!r}"
                )
        settings = getattr(spec, "settings", None) or NoSettings
        return settings(**{k: v for k, v in values.items() if k in own})


# ----------------------------------------------------------------------------- flat sections
# A config section whose chosen spec owns some of its keys (`LossConfig.variant`,
# `TemperatureConfig.mode`) is a frozen dataclass of the shared keys plus `settings`, the chosen
# spec's record; these three functions are its `__init__`, its flat keys and their defaults.


def init_flat(obj: Any, table: Registry, selector: str, values: Mapping[str, Any], where: str):
    """Set `obj`'s shared fields from `values` (defaults elsewhere) and its `settings` from the
    keys its chosen spec (field `selector`) owns. A `settings` record of that spec's type in
    `values` (as `dataclasses.replace` passes it) is the base the flat keys override."""
    shared = {f.name: f for f in dataclasses.fields(obj) if f.name != "settings"}
    unknown = sorted(set(values) - {"settings"} - set(shared) - set(table.settings_defaults()))
    if unknown:
        raise TypeError(f"{where} got unknown field(s) {unknown}")
    for name, f in shared.items():
        object.__setattr__(obj, name, values[name] if name in values else field_default(f))
    chosen = getattr(obj, selector)
    if chosen not in table:
        raise ValueError(f"{where}.{selector} must be one of {table.names()}, got {chosen!r}")
    own = getattr(table.get(chosen), "settings", None) or NoSettings
    flat = {k: v for k, v in values.items() if k not in shared and k != "settings"}
    if isinstance(values.get("settings"), own):
        flat = {**dataclasses.asdict(values["settings"]), **flat}
    object.__setattr__(obj, "settings", table.build_settings(chosen, flat, where))


def flat_fields(cls: type, table: Registry) -> dict[str, tuple[Any, Any]]:
    """key → (default, type hint): `cls`'s shared keys, then every registered spec's own keys."""
    hints = typing.get_type_hints(cls)
    out = {
        f.name: (field_default(f), hints[f.name])
        for f in dataclasses.fields(cls)
        if f.name != "settings"
    }
    for spec in table.specs():
        settings = getattr(spec, "settings", None) or NoSettings
        hints = typing.get_type_hints(settings)
        out.update({k: (field_default(f), hints[k]) for k, f in settings_fields(spec).items()})
    return out


def flat_values(obj: Any, table: Registry) -> dict[str, Any]:
    """`obj`'s flat keys as a config file holds them: every key at its default, then the shared
    fields and the chosen spec's settings."""
    shared = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name != "settings"}
    defaults = {k: default for k, (default, _) in flat_fields(type(obj), table).items()}
    return {**defaults, **shared, **dataclasses.asdict(obj.settings)}
