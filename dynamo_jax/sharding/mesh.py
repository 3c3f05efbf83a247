"""Device meshes from config: `MeshConfig` and `build_mesh`.

The mesh always has the three axes `data`, `fsdp` and `tensor` (in that order, outermost
first), so the logical-axis rules of `rules.py` can name them whatever the sizes are:

- `data`:   pure data parallelism (parameters replicated across it).
- `fsdp`:   data parallelism whose members also shard parameters and optimizer state (ZeRO-3).
- `tensor`: tensor (model) parallelism over heads, MLP width and vocabulary.

A size of -1 means "the rest of the devices" (at most one axis may say so). Everything is
validated before JAX compiles anything: a shape whose product does not match the device count,
or a rule naming an axis the mesh does not have, fails with a message naming the field.

Devices are laid out by a plain reshape of `jax.devices()`, which JAX orders process-major; the
outermost axis with size > 1 therefore spans hosts first, so the axes that need the fastest links
(`tensor`, then `fsdp`) stay inside a host whenever their size allows.

The axes are `AxisType.Auto` (what `Mesh(devices, names)` gives): XLA propagates shardings from
the in/out shardings and the few `with_sharding_constraint`s the model places. `jax.make_mesh`
would default to `Explicit` axes, under which a matmul over a sharded contracting dimension is a
type error; the model code is written for the automatic mode.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from dynamo_jax.sharding.rules import DEFAULT_RULES, LogicalRules, validate_rules

AXIS_NAMES: tuple[str, str, str] = ("data", "fsdp", "tensor")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """The mesh shape and the logical-axis rules that map model axis names onto it.

    Attributes:
      shape: sizes of the (data, fsdp, tensor) axes; one entry may be -1 (= the rest).
      rules: ordered (logical name, mesh axis | tuple of mesh axes | None) pairs. For each array
        dimension the first rule naming its logical axis whose mesh axes are still unused by the
        array wins (flax's priority semantics); a logical name with no rule is replicated.
    """

    shape: tuple[int, int, int] = (1, -1, 1)
    rules: LogicalRules = DEFAULT_RULES

    def __post_init__(self):
        shape = tuple(self.shape)
        if len(shape) != len(AXIS_NAMES):
            raise ValueError(
                f"MeshConfig.shape must have {len(AXIS_NAMES)} entries for axes {AXIS_NAMES}, "
                f"got {shape}"
            )
        for name, size in zip(AXIS_NAMES, shape):
            if not isinstance(size, (int, np.integer)) or isinstance(size, bool):
                raise ValueError(f"MeshConfig.shape[{name!r}] must be an int, got {size!r}")
            if size == 0 or size < -1:
                raise ValueError(
                    f"MeshConfig.shape[{name!r}] must be >= 1 or -1 (= rest), got {size}"
                )
        if sum(size == -1 for size in shape) > 1:
            raise ValueError(f"MeshConfig.shape may contain at most one -1, got {shape}")
        object.__setattr__(self, "shape", tuple(int(s) for s in shape))
        object.__setattr__(self, "rules", validate_rules(self.rules, AXIS_NAMES))

    def resolved_shape(self, num_devices: int) -> tuple[int, int, int]:
        """The concrete axis sizes for `num_devices` devices; raises if they cannot match."""
        return resolve_mesh_shape(self.shape, num_devices)

    def axis_sizes(self, num_devices: int) -> dict[str, int]:
        """`resolved_shape` by axis name (what `rules.row_shards` reads, as of a built mesh)."""
        return dict(zip(AXIS_NAMES, self.resolved_shape(num_devices)))


def resolve_mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """Fill the -1 entry of `shape` so the product equals `num_devices`, or raise clearly."""
    known = math.prod(s for s in shape if s != -1)
    named = dict(zip(AXIS_NAMES, shape))
    if -1 in shape:
        if num_devices % known:
            raise ValueError(
                f"MeshConfig.shape {named} cannot use {num_devices} devices: the fixed axes "
                f"multiply to {known}, which does not divide the device count"
            )
        return tuple(num_devices // known if s == -1 else s for s in shape)
    if known != num_devices:
        raise ValueError(
            f"MeshConfig.shape {named} needs {known} devices but {num_devices} are available; "
            "change the shape or use -1 for one axis"
        )
    return tuple(shape)


def build_mesh(cfg: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `Mesh` over `devices` (default: all global devices) with Auto axis types."""
    devices = list(jax.devices() if devices is None else devices)
    shape = cfg.resolved_shape(len(devices))
    device_grid = np.asarray(devices, dtype=object).reshape(shape)
    return Mesh(device_grid, AXIS_NAMES, axis_types=(AxisType.Auto,) * len(AXIS_NAMES))


def axis_size(mesh: Mesh, axes: str | Sequence[str] | None) -> int:
    """Product of the sizes of `axes` in `mesh` (1 for None / empty)."""
    if axes is None:
        return 1
    if isinstance(axes, str):
        axes = (axes,)
    return math.prod(mesh.shape[a] for a in axes)
