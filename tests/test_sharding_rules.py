"""searchjax.sharding: the validated rules table, logical -> PartitionSpec, meshes, constraints."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from searchjax.sharding import (
    DEFAULT_RULES,
    LOGICAL_AXES,
    MESH_AXES,
    ShardingError,
    logical_sharding,
    logical_to_spec,
    make_mesh,
    with_logical_constraint,
)
from searchjax.sharding.rules import validate_rules


def _rules(**changes):
    rules = dict(DEFAULT_RULES)
    rules.update(changes)
    return rules


def test_default_table_covers_every_logical_axis_with_known_mesh_axes():
    validate_rules(DEFAULT_RULES)
    assert set(DEFAULT_RULES) == set(LOGICAL_AXES)
    assert all(set(v) <= set(MESH_AXES) for v in DEFAULT_RULES.values())


@pytest.mark.parametrize(
    "rules,match",
    [
        (_rules(bogus=("fsdp",)), "unknown logical axes \\['bogus'\\]"),
        ({k: v for k, v in DEFAULT_RULES.items() if k != "vocab"}, "missing \\['vocab'\\]"),
        (_rules(embed=("fsdp", "pipeline")), "rules\\['embed'\\]: unknown mesh axes \\['pipeline'\\]"),
        (_rules(ffw="tensor"), "rules\\['ffw'\\]: expected a tuple"),
    ],
)
def test_bad_tables_raise_naming_the_axis(rules, match):
    with pytest.raises(ShardingError, match=match):
        validate_rules(rules)
    with pytest.raises(ShardingError, match=match):
        logical_to_spec(("embed", "ffw"), rules)


def test_spec_without_mesh_follows_the_table():
    assert logical_to_spec(("batch", "seq", "embed")) == P(("data", "fsdp", "expert"), None, None)
    assert logical_to_spec(("embed", "ffw")) == P("fsdp", "tensor")
    assert logical_to_spec((None, "experts", "embed", "ffw")) == P(None, "expert", "fsdp", "tensor")


def test_a_mesh_axis_is_used_once_per_array():
    # batch takes data and fsdp; embed then may not reuse fsdp.
    mesh = make_mesh({"data": 2, "fsdp": 4})
    assert logical_to_spec(("batch", "seq", "embed"), mesh=mesh) == P(("data", "fsdp"), None, None)


def test_batch_is_split_over_expert_parallel_devices_too():
    mesh = make_mesh({"fsdp": 2, "expert": 4})
    assert logical_to_spec(("batch", "seq"), mesh=mesh, shape=(8, 3)) == P(("fsdp", "expert"), None)
    assert logical_to_spec(("experts", "embed", "ffw"), mesh=mesh, shape=(8, 4, 4)) == P("expert", "fsdp", None)


def test_size_one_mesh_axes_are_dropped():
    mesh = make_mesh({"fsdp": 8})
    assert logical_to_spec(("batch", "embed", "ffw"), mesh=mesh) == P("fsdp", None, None)


def test_non_dividing_axes_are_skipped():
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    assert logical_to_spec(("embed", "ffw"), mesh=mesh, shape=(6, 8)) == P("fsdp", "tensor")
    assert logical_to_spec(("embed", "ffw"), mesh=mesh, shape=(5, 7)) == P(None, None)
    # batch over data×fsdp needs a multiple of 4; 6 is divisible by data (2) only.
    assert logical_to_spec(("batch",), mesh=mesh, shape=(6,)) == P("data")
    assert logical_to_spec(("batch",), mesh=mesh, shape=(8,)) == P(("data", "fsdp"))


def test_unknown_logical_axis_raises():
    with pytest.raises(ShardingError, match="unknown logical axis 'hidden'"):
        logical_to_spec(("hidden",))


def test_make_mesh_shapes_and_errors():
    assert dict(make_mesh().shape) == {"data": 1, "fsdp": 8, "tensor": 1, "expert": 1}
    assert dict(make_mesh({"tensor": 2, "fsdp": -1}).shape) == {"data": 1, "fsdp": 4, "tensor": 2, "expert": 1}
    assert make_mesh({"expert": 2}, devices=jax.devices()[:2]).devices.size == 2
    with pytest.raises(ShardingError, match="unknown axes \\['model'\\]"):
        make_mesh({"model": 2})
    with pytest.raises(ShardingError, match="at most one axis may be -1"):
        make_mesh({"fsdp": -1, "tensor": -1})
    with pytest.raises(ShardingError, match="not divisible by 3"):
        make_mesh({"fsdp": -1, "tensor": 3})
    with pytest.raises(ShardingError, match="has 4 devices, but 8"):
        make_mesh({"fsdp": 4})


def test_logical_sharding_places_shards():
    mesh = make_mesh({"fsdp": 2, "tensor": 4})
    x = jax.device_put(np.arange(64, dtype=np.float32).reshape(8, 8), logical_sharding(mesh, ("embed", "ffw"), (8, 8)))
    assert {s.data.shape for s in x.addressable_shards} == {(4, 2)}
    np.testing.assert_array_equal(np.asarray(x), np.arange(64).reshape(8, 8))


def test_with_logical_constraint():
    x = jnp.ones((8, 4))
    assert with_logical_constraint(x, ("batch", "embed"), None) is x
    mesh = make_mesh({"fsdp": 8})
    y = jax.jit(lambda a: with_logical_constraint(a * 2, ("batch", None), mesh))(x)
    assert y.sharding.is_equivalent_to(logical_sharding(mesh, ("batch", None)), 2)
    np.testing.assert_array_equal(np.asarray(y), 2 * np.ones((8, 4)))
