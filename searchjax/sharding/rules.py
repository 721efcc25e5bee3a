"""The logical -> mesh axis table, validated, and helpers that turn logical axes into shardings."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# The closed set of logical axis names used anywhere in the project (CONVENTIONS.md).
LOGICAL_AXES = (
    "batch",      # B: sequences of a batch
    "seq",        # T/S: positions
    "embed",      # D: model width
    "q_heads",    # N: query heads (and DeltaNet value heads)
    "kv_heads",   # K: key/value heads (and DeltaNet key heads)
    "head_dim",   # H: per-head width
    "ffw",        # F: feed-forward width (experts and shared expert)
    "experts",    # E: routed experts
    "vocab",      # V: vocabulary
    "layers",     # L: stacked layers
    "cache_seq",  # S in a decode cache
)

# The mesh axes, outermost first. `data` replicates parameters; `fsdp` shards parameters and the batch;
# `tensor` shards heads and feed-forward width; `expert` shards routed experts.
MESH_AXES = ("data", "fsdp", "tensor", "expert")

Rules = Mapping[str, tuple[str, ...]]

# One table. A logical axis maps to a tuple of mesh axes (empty = replicated). The batch is split over every
# data-parallel axis; weights are split over fsdp on their `embed` dimension and over tensor on heads/ffw/vocab;
# experts go over `expert`. The batch is split over `expert` too: outside the MoE layers the expert-parallel
# devices work on different sequences instead of repeating the same computation.
DEFAULT_RULES: Rules = {
    "batch": ("data", "fsdp", "expert"),
    "seq": (),
    "embed": ("fsdp",),
    "q_heads": ("tensor",),
    "kv_heads": ("tensor",),
    "head_dim": (),
    "ffw": ("tensor",),
    "experts": ("expert",),
    "vocab": ("tensor",),
    "layers": (),
    "cache_seq": (),
}


class ShardingError(ValueError):
    """A rules table or a logical axis list is invalid; the message names the axis."""


def validate_rules(rules: Rules) -> None:
    """Check that the table covers exactly LOGICAL_AXES and only names MESH_AXES."""
    unknown = sorted(set(rules) - set(LOGICAL_AXES))
    missing = sorted(set(LOGICAL_AXES) - set(rules))
    if unknown or missing:
        raise ShardingError(f"rules: unknown logical axes {unknown}, missing {missing}; valid: {list(LOGICAL_AXES)}")
    for logical, mesh_axes in rules.items():
        if isinstance(mesh_axes, str):
            raise ShardingError(f"rules[{logical!r}]: expected a tuple of mesh axes, got the string {mesh_axes!r}")
        bad = [a for a in mesh_axes if a not in MESH_AXES]
        if bad:
            raise ShardingError(f"rules[{logical!r}]: unknown mesh axes {bad}; valid: {list(MESH_AXES)}")


validate_rules(DEFAULT_RULES)


def logical_to_spec(
    axes: Sequence[str | None],
    rules: Rules = DEFAULT_RULES,
    mesh: Mesh | None = None,
    shape: Sequence[int] | None = None,
) -> PartitionSpec:
    """PartitionSpec for an array whose dimensions carry the logical names `axes` (None = unnamed, replicated).

    A mesh axis is used at most once per array (the first dimension that asks for it wins). With `mesh`, mesh
    axes of size 1 are dropped, and with `shape` also a mesh axis whose size does not divide the dimension
    (so a tiny test model still shards cleanly on a large mesh: that dimension is replicated instead).
    """
    if rules is not DEFAULT_RULES:
        validate_rules(rules)
    used: set[str] = set()
    spec = []
    for i, name in enumerate(axes):
        if name is None:
            spec.append(None)
            continue
        if name not in rules:
            raise ShardingError(f"unknown logical axis {name!r}; valid: {list(LOGICAL_AXES)}")
        chosen = []
        for mesh_axis in rules[name]:
            if mesh_axis in used:
                continue
            if mesh is not None:
                size = mesh.shape.get(mesh_axis, 1)
                if size == 1:
                    continue
                if shape is not None:
                    prod = math.prod(mesh.shape[a] for a in chosen) * size
                    if shape[i] % prod:
                        continue
            chosen.append(mesh_axis)
            used.add(mesh_axis)
        spec.append(tuple(chosen) if len(chosen) > 1 else (chosen[0] if chosen else None))
    return PartitionSpec(*spec)


def logical_sharding(
    mesh: Mesh, axes: Sequence[str | None], shape: Sequence[int] | None = None, rules: Rules = DEFAULT_RULES
) -> NamedSharding:
    """NamedSharding on `mesh` for logical `axes` (see logical_to_spec)."""
    return NamedSharding(mesh, logical_to_spec(axes, rules, mesh, shape))


def with_logical_constraint(x: jax.Array, axes: Sequence[str | None], mesh: Mesh | None, rules: Rules = DEFAULT_RULES):
    """`jax.lax.with_sharding_constraint` by logical axes; a no-op without a mesh."""
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, logical_sharding(mesh, axes, x.shape, rules))


def make_mesh(shape: Mapping[str, int] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A Mesh over MESH_AXES. `shape` gives sizes of some axes; one axis may be -1 (the rest of the devices).

    Missing axes get size 1. The product must equal the number of devices.
    """
    devices = list(devices if devices is not None else jax.devices())
    shape = dict(shape or {"fsdp": -1})
    bad = sorted(set(shape) - set(MESH_AXES))
    if bad:
        raise ShardingError(f"mesh shape: unknown axes {bad}; valid: {list(MESH_AXES)}")
    sizes = {a: int(shape.get(a, 1)) for a in MESH_AXES}
    free = [a for a, s in sizes.items() if s == -1]
    if len(free) > 1:
        raise ShardingError(f"mesh shape: at most one axis may be -1, got {free}")
    known = math.prod(s for s in sizes.values() if s != -1)
    if free:
        if len(devices) % known:
            raise ShardingError(f"mesh shape {shape}: {len(devices)} devices not divisible by {known}")
        sizes[free[0]] = len(devices) // known
    total = math.prod(sizes.values())
    if total != len(devices):
        raise ShardingError(f"mesh shape {sizes} has {total} devices, but {len(devices)} are available")
    try:
        mesh_devices = mesh_utils.create_device_mesh(
            tuple(sizes[a] for a in MESH_AXES), devices=devices
        )
    except Exception:  # noqa: BLE001 - fall back to a plain reshape on backends without topology info
        mesh_devices = np.asarray(devices, dtype=object).reshape(tuple(sizes[a] for a in MESH_AXES))
    return Mesh(mesh_devices, MESH_AXES)
