"""Logical axis names -> mesh axes: one validated table, and mesh construction.

Every array in searchjax names its dimensions with a small closed set of *logical* axes. A rules table maps
each logical axis to zero or more *mesh* axes (data, fsdp, tensor, expert). Shardings of parameters, caches and
activations are derived from that one table, so changing the parallelism of a run is a change of mesh shape,
never of model code.
"""

from searchjax.sharding.rules import (
    LOGICAL_AXES,
    MESH_AXES,
    DEFAULT_RULES,
    Rules,
    ShardingError,
    logical_to_spec,
    logical_sharding,
    make_mesh,
    with_logical_constraint,
)

__all__ = [
    "LOGICAL_AXES",
    "MESH_AXES",
    "DEFAULT_RULES",
    "Rules",
    "ShardingError",
    "logical_to_spec",
    "logical_sharding",
    "make_mesh",
    "with_logical_constraint",
]
