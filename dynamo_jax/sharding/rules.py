"""Logical-axis rules → shardings, resolved in one place for params, optimizer state and batches.

Model code names array dimensions with logical axes (`embed`, `heads`, `kv_heads`, `head_dim`,
`mlp`, `vocab`, `layers` for parameters; `act_batch`, `act_len`, `act_embed`, `act_heads`,
`act_vocab`, ... for activations). The config's rules table maps each logical name to mesh axes;
this module turns that table into `NamedSharding`s. The model code never changes between meshes.

Indivisible dimensions (documented choice): JAX requires a jit argument's sharded dimension to
be a multiple of the number of shards, and Qwen2.5-1.5B has 2 KV heads (12 query heads) while a
tensor axis may be 4 or 8. `fit_spec` therefore keeps, per dimension, the longest prefix of the
rule's mesh axes whose size product divides the dimension, and replicates that dimension over
the dropped axes. The result is the same numbers with more memory for that one array (e.g. the
KV projections of a 2-KV-head model are replicated over `tensor=4` while Q, O and the MLP stay
split). `fit_rules` applies the same step to the activation rules from the model's dimensions so
`with_logical_constraint` inside the model never asks for an uneven split (XLA would pad it,
which is correct but wastes the axis). The batch is the exception: a global batch that does not
divide over the `act_batch` axes is a configuration error, because each device must own whole
sequences; `batch_sharding` raises for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MeshAxes = str | tuple[str, ...] | None
LogicalRules = tuple[tuple[str, MeshAxes], ...]

# Megatron-style tensor parallelism over heads / MLP width / vocabulary, with FSDP over the
# model width, and the batch over both data-parallel axes. `layers` stays unsharded: a scanned
# layer stack is sliced one layer per scan step, which a sharded leading axis would turn into a
# gather of every layer on every step.
DEFAULT_RULES: LogicalRules = (
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("act_batch", ("data", "fsdp")),
    ("act_len", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
)


def _as_axes_tuple(axes: MeshAxes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def validate_rules(rules: Sequence[Sequence[Any]], axis_names: Sequence[str]) -> LogicalRules:
    """Check a rules table against the mesh's axis names; return it as a tuple of tuples."""
    out = []
    for i, rule in enumerate(rules):
        if isinstance(rule, str) or len(rule) != 2:
            raise ValueError(
                f"MeshConfig.rules[{i}] must be a (logical_name, mesh_axes) pair, got {rule!r}"
            )
        logical, axes = rule
        if not isinstance(logical, str) or not logical:
            raise ValueError(
                f"MeshConfig.rules[{i}]: logical name must be a string, got {logical!r}"
            )
        if axes is not None and not isinstance(axes, str):
            if not all(isinstance(a, str) for a in axes):
                raise ValueError(
                    f"MeshConfig.rules[{i}] ({logical!r}): mesh axes must be a name, a tuple of "
                    f"names or None, got {axes!r}"
                )
            axes = tuple(axes)
        for a in _as_axes_tuple(axes):
            if a not in axis_names:
                raise ValueError(
                    f"MeshConfig.rules[{i}] maps logical axis {logical!r} to unknown mesh axis "
                    f"{a!r}; the mesh axes are {tuple(axis_names)}"
                )
        if len(set(_as_axes_tuple(axes))) != len(_as_axes_tuple(axes)):
            raise ValueError(f"MeshConfig.rules[{i}] ({logical!r}) repeats a mesh axis: {axes!r}")
        out.append((logical, axes))
    return tuple(out)


def _fit_axes(axes: MeshAxes, size: int, mesh: Mesh) -> MeshAxes:
    """Longest prefix of `axes` whose mesh-size product divides `size` (None if empty)."""
    kept: list[str] = []
    for a in _as_axes_tuple(axes):
        if size % (math.prod(mesh.shape[k] for k in kept) * mesh.shape[a]):
            break
        kept.append(a)
    if not kept:
        return None
    return kept[0] if len(kept) == 1 and isinstance(axes, str) else tuple(kept)


def fit_spec(spec: P, shape: Sequence[int], mesh: Mesh) -> P:
    """Drop, per dimension, the mesh axes that do not evenly divide it (see module docstring)."""
    entries = tuple(spec) + (None,) * (len(shape) - len(spec))
    return P(*(_fit_axes(axes, size, mesh) for axes, size in zip(entries, shape)))


def logical_to_sharding(
    logical: P | Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules: LogicalRules
) -> NamedSharding:
    """The sharding of one array from its logical axis names and shape."""
    names = tuple(logical)
    if len(names) != len(shape):
        raise ValueError(
            f"logical axes {names} have {len(names)} entries but the array has shape {tuple(shape)}"
        )
    spec = nn.logical_to_mesh_axes(names, rules)
    return NamedSharding(mesh, fit_spec(spec, shape, mesh))


def param_shardings(
    abstract_params: Any, logical_axes: Any, mesh: Mesh, rules: LogicalRules
) -> Any:
    """NamedShardings for a parameter tree from its logical PartitionSpecs (same structure)."""
    return jax.tree.map(
        lambda spec, x: logical_to_sharding(spec, x.shape, mesh, rules),
        logical_axes,
        abstract_params,
        is_leaf=lambda s: isinstance(s, P),
    )


def opt_state_shardings(
    optimizer: optax.GradientTransformation,
    abstract_opt_state: Any,
    params_shardings: Any,
    mesh: Mesh,
) -> Any:
    """Optimizer-state shardings derived from the parameters' (moments follow their parameter).

    Leaves that are not per-parameter copies (step counters, scalars of schedules, ...) are
    replicated.
    """
    replicated = NamedSharding(mesh, P())
    return optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        abstract_opt_state,
        params_shardings,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )


def fit_rules(
    rules: LogicalRules, mesh: Mesh, dims: Mapping[str, int | Sequence[int]]
) -> LogicalRules:
    """Rules with each logical name's mesh axes cut to those dividing all its known sizes.

    `dims` maps logical names to the size(s) they take (e.g. `act_heads` → num_heads); names
    absent from `dims` keep their rule unchanged.
    """
    out = []
    for logical, axes in rules:
        sizes = dims.get(logical)
        if sizes is not None:
            for size in (sizes,) if isinstance(sizes, int) else sizes:
                axes = _fit_axes(axes, int(size), mesh)
        out.append((logical, axes))
    return tuple(out)


def rule_axes(rules: LogicalRules, logical: str) -> MeshAxes:
    """The mesh axes of the first rule for `logical` (None if it has no rule)."""
    for name, axes in rules:
        if name == logical:
            return axes
    return None


def row_shards(axis_sizes: Mapping[str, int], rules: LogicalRules) -> int:
    """How many ways a batch's rows are split: the size of the mesh axes of the `act_batch` rule.
    `axis_sizes`: a built `Mesh.shape`, or a config's (`MeshConfig.axis_sizes`)."""
    return math.prod(axis_sizes[a] for a in _as_axes_tuple(rule_axes(rules, "act_batch")) if a)


def batch_sharding(mesh: Mesh, rules: LogicalRules, batch_size: int, ndim: int) -> NamedSharding:
    """Sharding of a per-sequence batch array: dim 0 over the `act_batch` axes, rest replicated."""
    axes = rule_axes(rules, "act_batch")
    n = row_shards(mesh.shape, rules)
    if batch_size % n:
        raise ValueError(
            f"batch size {batch_size} does not divide over the act_batch mesh axes {axes} "
            f"(size {n}); use a multiple of {n}"
        )
    return NamedSharding(mesh, P(axes, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    """A fully replicated sharding on `mesh` (scalars, temperatures, counters)."""
    return NamedSharding(mesh, P())
