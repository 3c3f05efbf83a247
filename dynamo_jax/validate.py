"""The field checks every config dataclass makes in its `__post_init__`, written once.

Each raises `ValueError` whose message starts with `where.field` (`where` is the section or the
class name the module's errors already use, e.g. "train" or "LossConfig"); `config.build_section`
turns it into a `ConfigError` naming the section, so launch.py prints it as one line (exit 2).
This module imports nothing of the package, so every config module may use it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def is_int(value: Any) -> bool:
    """An int that is not a bool (True would otherwise pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or float that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def must(ok: bool, where: str, name: str, what: str, value: Any) -> None:
    """'<where>.<name> must be <what>, got <value>' unless `ok`."""
    if not ok:
        raise ValueError(f"{where}.{name} must be {what}, got {value!r}")


def require(ok: bool, where: str, name: str, message: str) -> None:
    """'<where>.<name>: <message>' unless `ok` (for messages that are not 'must be ...')."""
    if not ok:
        raise ValueError(f"{where}.{name}: {message}")


def one_of(where: str, name: str, value: Any, allowed: Iterable) -> None:
    """`value` is one of `allowed` (a tuple, shown as written)."""
    if value not in allowed:
        raise ValueError(f"{where}.{name} must be one of {allowed}, got {value!r}")


def positive(where: str, obj: Any, *names: str) -> None:
    """Each field `names` of `obj` is > 0."""
    for name in names:
        value = getattr(obj, name)
        must(value > 0, where, name, "> 0", value)


def positive_ints(where: str, obj: Any, *names: str) -> None:
    """Each field `names` of `obj` is an int >= 1."""
    for name in names:
        value = getattr(obj, name)
        must(is_int(value) and value >= 1, where, name, "a positive int", value)


def int_at_least(where: str, obj: Any, name: str, low: int) -> None:
    """Field `name` of `obj` is an int >= `low`."""
    value = getattr(obj, name)
    must(is_int(value) and value >= low, where, name, f"an int >= {low}", value)


def finite(where: str, name: str, value: Any) -> None:
    """A finite number."""
    must(is_number(value) and math.isfinite(value), where, name, "a finite number", value)


def probability(where: str, name: str, value: Any, *, open_low: bool = False) -> None:
    """In [0, 1] (or (0, 1] with `open_low`)."""
    ok = is_number(value) and (0.0 < value if open_low else 0.0 <= value) and value <= 1.0
    must(ok, where, name, "in (0, 1]" if open_low else "in [0, 1]", value)


def boolean(where: str, name: str, value: Any) -> None:
    must(isinstance(value, bool), where, name, "a bool", value)
