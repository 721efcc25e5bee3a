"""Sharded == unsharded on 8 fake CPU devices: params created sharded, forward and the MoE dispatch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.model import forward, init_params, load_preset, param_shardings
from searchjax.model.moe_dispatch import expert_ffn
from searchjax.sharding import logical_sharding, make_mesh

MESHES = {
    "fsdp2_tensor4": {"fsdp": 2, "tensor": 4},
    "fsdp2_expert4": {"fsdp": 2, "expert": 4},
    "data2_fsdp2_expert2": {"data": 2, "fsdp": 2, "expert": 2},
}


@pytest.fixture(scope="module")
def tiny():
    cfg = load_preset("tiny")
    tokens = jax.random.randint(jax.random.key(1), (8, 24), 0, cfg.vocab_size, dtype=jnp.int32)
    params = init_params(cfg, jax.random.key(0))
    return cfg, tokens, params, np.asarray(forward(params, tokens, cfg))


def _nontrivial(sharding) -> bool:
    return any(axis is not None for axis in sharding.spec)


@pytest.mark.parametrize("name", sorted(MESHES))
def test_sharded_forward_equals_unsharded(tiny, name):
    cfg, tokens, _, ref = tiny
    mesh = make_mesh(MESHES[name])
    params = init_params(cfg, jax.random.key(0), mesh=mesh)
    expected = param_shardings(cfg, mesh)
    got_leaves = jax.tree.leaves(params)
    want_leaves = jax.tree.leaves(expected)
    assert len(got_leaves) == len(want_leaves)
    for leaf, want in zip(got_leaves, want_leaves):
        assert leaf.sharding.is_equivalent_to(want, leaf.ndim), (leaf.shape, leaf.sharding, want)
    # The mesh really splits the weights (not everything silently replicated).
    assert sum(_nontrivial(leaf.sharding) for leaf in got_leaves) >= 5
    if "expert" in MESHES[name]:  # stacked [L, E, D, F]: experts split over the expert axis
        assert params.linear.moe.w_gate.sharding.spec[1] == "expert"
    batch = logical_sharding(mesh, ("batch", "seq"), tokens.shape)
    out = forward(params, jax.device_put(tokens, batch), cfg)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["ragged", "block"])
def test_dispatch_with_expert_sharded_weights(impl):
    """Weights split over `expert` (and tokens over fsdp): GSPMD's result equals the single-device one."""
    mesh = make_mesh({"fsdp": 2, "expert": 4})
    rng = np.random.default_rng(0)
    n, e, x_per_tok, d, f = 48, 8, 2, 16, 24
    x = rng.normal(size=(n, d)).astype(np.float32)
    idx = np.stack([rng.choice(e, x_per_tok, replace=False) for _ in range(n)]).astype(np.int32)
    w = rng.random((n, x_per_tok)).astype(np.float32)
    ws = [(rng.normal(size=s) * 0.2).astype(np.float32) for s in ((e, d, f), (e, d, f), (e, f, d))]
    fn = jax.jit(lambda *a: expert_ffn(*a, impl=impl))
    ref = np.asarray(fn(x, idx, w, *ws))
    tok = logical_sharding(mesh, ("batch", None), x.shape)
    wsh = [logical_sharding(mesh, ("experts", None, None), a.shape) for a in ws]
    assert wsh[0].spec[0] == "expert"
    args = [jax.device_put(x, tok), jax.device_put(idx, tok), jax.device_put(w, tok)]
    args += [jax.device_put(a, s) for a, s in zip(ws, wsh)]
    np.testing.assert_allclose(np.asarray(fn(*args)), ref, rtol=1e-5, atol=1e-5)
    grad = jax.jit(jax.grad(lambda *a: jnp.sum(expert_ffn(*a, impl=impl) ** 2), argnums=(0, 3, 4, 5)))
    for g_sharded, g_ref in zip(grad(*args), grad(x, idx, w, *ws)):
        np.testing.assert_allclose(np.asarray(g_sharded), np.asarray(g_ref), rtol=1e-5, atol=1e-5)
