"""expert_ffn against a dense numpy reference (values) and a dense JAX reference (gradients)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.model import moe_dispatch
from searchjax.model.moe_dispatch import default_block_size, default_capacity, expert_ffn, overflow_block_size

IMPLS = ("ragged", "block")


def _numpy_reference(x, idx, w, wg, wu, wd):
    """Token-by-token loop in float64: y[n] = Σ_j w[n,j] (silu(x Wg[e]) ⊙ x Wu[e]) Wd[e]."""
    x, w, wg, wu, wd = (np.asarray(a, np.float64) for a in (x, w, wg, wu, wd))
    out = np.zeros_like(x)
    for n in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = idx[n, j]
            h = x[n] @ wg[e]
            out[n] += w[n, j] * ((h / (1.0 + np.exp(-h)) * (x[n] @ wu[e])) @ wd[e])
    return out


def _dense_jax_reference(x, idx, w, wg, wu, wd):
    """Every token through every expert, masked by a one-hot combine matrix (differentiable, compute ∝ E)."""
    combine = jnp.einsum("NXE,NX->NE", jax.nn.one_hot(idx, wg.shape[0], dtype=x.dtype), w)
    h = jnp.einsum("ND,EDF->ENF", x, wg)
    a = jax.nn.silu(h) * jnp.einsum("ND,EDF->ENF", x, wu)
    return jnp.einsum("ENF,EFD,NE->ND", a, wd, combine)


def _inputs(seed, n, e, x_per_tok, d=8, f=12, unused=0, dtype=np.float32):
    """Random tokens, distinct expert ids per token drawn from the first e-unused experts (rest get none)."""
    rng = np.random.default_rng(seed)
    live = e - unused
    idx = np.stack([rng.choice(live, x_per_tok, replace=False) for _ in range(n)]).astype(np.int32)
    w = rng.random((n, x_per_tok))
    w = (w / w.sum(-1, keepdims=True)).astype(dtype)
    x = rng.normal(size=(n, d)).astype(dtype)
    wg = (rng.normal(size=(e, d, f)) / np.sqrt(d)).astype(dtype)
    wu = (rng.normal(size=(e, d, f)) / np.sqrt(d)).astype(dtype)
    wd = (rng.normal(size=(e, f, d)) / np.sqrt(f)).astype(dtype)
    return x, idx, w, wg, wu, wd


CASES = [  # (N, E, X, experts with no token)
    (1, 4, 1, 0),
    (1, 8, 2, 0),
    (5, 64, 4, 0),
    (33, 8, 3, 3),
    (64, 16, 4, 5),
    (200, 4, 2, 0),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n,e,x_per_tok,unused", CASES)
def test_matches_numpy_reference(impl, n, e, x_per_tok, unused):
    for seed in range(2):
        args = _inputs(seed, n, e, x_per_tok, unused=unused)
        got = jax.jit(lambda *a: expert_ffn(*a, impl=impl))(*args)
        np.testing.assert_allclose(np.asarray(got), _numpy_reference(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block_size", [1, 2, 5, 16, 64])
def test_block_sizes_agree(block_size):
    args = _inputs(3, 41, 8, 3, unused=2)
    got = expert_ffn(*args, impl="block", block_size=block_size)
    np.testing.assert_allclose(np.asarray(got), _numpy_reference(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_stacked_weights_with_layer_index_match_that_layer(impl):
    """layer=l on stacks [L, E, ...] (traced l, as inside a layer scan) equals expert_ffn on layer l's weights."""
    layers = [_inputs(seed, 19, 8, 3, unused=1) for seed in (5, 6, 7)]
    x, idx, w = layers[0][:3]
    stacks = [np.stack([a[i] for a in layers]) for i in (3, 4, 5)]
    run = jax.jit(lambda l, *ws: expert_ffn(x, idx, w, *ws, impl=impl, layer=l))
    for l in range(3):
        want = _numpy_reference(x, idx, w, *layers[l][3:])
        np.testing.assert_allclose(np.asarray(run(jnp.int32(l), *stacks)), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="stacked"):
        expert_ffn(x, idx, w, *layers[0][3:], layer=0)


def test_repeated_expert_in_a_row_counts_twice():
    x, _, _, wg, wu, wd = _inputs(4, 3, 4, 2)
    idx = np.array([[1, 1], [0, 3], [2, 2]], np.int32)
    w = np.array([[0.25, 0.5], [1.0, 0.0], [0.3, 0.3]], np.float32)
    for impl in IMPLS:
        got = expert_ffn(x, idx, w, wg, wu, wd, impl=impl)
        np.testing.assert_allclose(np.asarray(got), _numpy_reference(x, idx, w, wg, wu, wd), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_gradients_match_dense_reference(impl):
    args = _inputs(5, 23, 8, 2, unused=2)
    x, idx, w, wg, wu, wd = args
    cot = np.random.default_rng(6).normal(size=x.shape).astype(np.float32)

    def loss(fn):
        return lambda x, w, wg, wu, wd: jnp.sum(fn(x, idx, w, wg, wu, wd) * cot)

    ours = jax.jit(jax.grad(loss(lambda *a: expert_ffn(*a, impl=impl)), argnums=(0, 1, 2, 3, 4)))(x, w, wg, wu, wd)
    ref = jax.grad(loss(_dense_jax_reference), argnums=(0, 1, 2, 3, 4))(x, w, wg, wu, wd)
    for name, g, r in zip(("x", "top_w", "w_gate", "w_up", "w_down"), ours, ref):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("impl", IMPLS)
def test_bfloat16_accumulates_in_float32(impl):
    args = _inputs(7, 32, 8, 2, d=64, f=32)
    bf = [a if a.dtype == np.int32 else jnp.asarray(a, jnp.bfloat16) for a in args]
    got = jax.jit(lambda *a: expert_ffn(*a, impl=impl))(*bf)
    assert got.dtype == jnp.bfloat16
    ref = _numpy_reference(*[np.asarray(jnp.asarray(a, jnp.float32)) if a.dtype != np.int32 else a for a in bf])
    # bf16 inputs, fp32 accumulation: error is a few bf16 ulps of the output, not √D-growing.
    np.testing.assert_allclose(np.asarray(got, np.float32), ref, rtol=2e-2, atol=2e-2)


def test_default_block_sizes_and_capacity_track_mean_group():
    """Pure blocks: a power of two near mean/4 (1 for decode); overflow blocks: the power of two ≥ √mean."""
    assert default_block_size(8, 256) == 1 and default_capacity(8, 256) == 0
    assert default_block_size(64, 64) == 1 and default_capacity(64, 64) == 0  # decode: 16 tokens, top-4 of 64
    assert default_block_size(8192, 8) == 256 and default_capacity(8192, 8) == 1024
    assert default_block_size(8192, 64) == 32 and default_capacity(8192, 64) == 128
    assert default_block_size(8192, 256) == 8 and default_capacity(8192, 256) == 32
    assert default_block_size(100, 4) == 4 and default_capacity(100, 4) == 24
    assert [overflow_block_size(8192, e) for e in (8, 64, 256)] == [32, 16, 8]
    assert overflow_block_size(100, 4) == 8 and overflow_block_size(64, 64) == 1


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda a: (a[0], a[1][:2], *a[2:]), "top_idx must be"),
        (lambda a: (a[0], a[1], a[2][:, :1], *a[3:]), "top_w shape"),
        (lambda a: (a[0], a[1].astype(np.float32), *a[2:]), "must be integer"),
        (lambda a: (*a[:5], a[5][:, :, :3]), "w_down"),
    ],
)
def test_bad_input_raises(change, match):
    args = _inputs(8, 4, 4, 2)
    with pytest.raises(ValueError, match=match):
        expert_ffn(*change(args))


def test_unknown_impl_raises():
    with pytest.raises(ValueError, match="impl must be one of"):
        expert_ffn(*_inputs(9, 2, 4, 1), impl="dense")


def test_config_moe_impl_resolves_and_both_give_the_same_model_output():
    from searchjax.model import forward, init_params, load_preset
    from searchjax.model.moe_dispatch import default_impl, resolve_impl

    assert resolve_impl("auto") == default_impl() and resolve_impl("ragged") == "ragged"
    cfg = load_preset("tiny")
    params = init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, cfg.vocab_size, jnp.int32)
    block = forward(params, tokens, cfg.replace(moe_impl="block"))
    ragged = forward(params, tokens, cfg.replace(moe_impl="ragged"))
    np.testing.assert_allclose(np.asarray(block), np.asarray(ragged), rtol=1e-5, atol=1e-5)


# --- "block": capacity slots + overflow blocks -------------------------------------------------------------------

def _routing(kind, seed, n, e, x_per_tok):
    """Expert ids [n, X] (distinct per token): balanced (uniform), skewed (Zipf-like) or all_to_one (expert 3 first)."""
    rng = np.random.default_rng(seed)
    if kind == "balanced":
        p = np.full(e, 1.0 / e)
    elif kind == "skewed":
        p = 1.0 / np.arange(1, e + 1) ** 1.5
        p = p / p.sum()
    else:
        idx = np.stack([np.concatenate([[3], rng.choice(np.delete(np.arange(e), 3), x_per_tok - 1, replace=False)])
                        for _ in range(n)])
        return idx.astype(np.int32)
    return np.stack([rng.choice(e, x_per_tok, replace=False, p=p) for _ in range(n)]).astype(np.int32)


def _split(kind, seed, n=96, e=8, x_per_tok=2, **kw):
    """Inputs whose routing puts rows both in the capacity slots and in overflow blocks (checked)."""
    args = list(_inputs(seed, n, e, x_per_tok, **kw))
    args[1] = _routing(kind, seed, n, e, x_per_tok)
    m = n * x_per_tok
    capacity, block = default_capacity(m, e), 4
    lay = moe_dispatch._layout(jnp.asarray(args[1]).reshape(-1), e, x_per_tok, capacity, block)
    assert capacity > 0 and int(lay.used_blocks) > 0 and bool(jnp.any(lay.in_cap)), (capacity, lay.used_blocks)
    return args, capacity, block


ROUTINGS = ("balanced", "skewed", "all_to_one")


@pytest.mark.parametrize("kind", ROUTINGS)
def test_capacity_and_overflow_match_numpy_reference(kind):
    """Forced capacity + overflow path (max_overflow=1), the forced pure block scheme (max_overflow=0: any
    overflow switches), and for one routing the defaults, C = 0 and C above every group."""
    run = jax.jit(lambda *a, cap, b, mo: expert_ffn(*a, impl="block", block_size=b, capacity=cap, max_overflow=mo),
                  static_argnames=("cap", "b", "mo"))
    args, capacity, block = _split(kind, 1)
    want = _numpy_reference(*args)
    np.testing.assert_allclose(np.asarray(run(*args, cap=capacity, b=block, mo=1.0)), want, rtol=1e-5, atol=1e-5)
    more = ((None, None, 0.25), (0, 3, 1.0), (200, 3, 1.0)) if kind == "balanced" else ()
    for cap, b, mo in ((capacity, 3, 0.0), *more):
        got = run(*args, cap=cap, b=b, mo=mo)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5, err_msg=f"{cap} {b} {mo}")


@pytest.mark.parametrize("kind", ROUTINGS)
def test_capacity_and_overflow_gradients_match_dense_reference(kind):
    args, capacity, block = _split(kind, 11)
    x, idx, w, wg, wu, wd = args
    cot = np.random.default_rng(12).normal(size=x.shape).astype(np.float32)

    def loss(fn):
        return lambda x, w, wg, wu, wd: jnp.sum(fn(x, idx, w, wg, wu, wd) * cot)

    ref = jax.grad(loss(_dense_jax_reference), argnums=(0, 1, 2, 3, 4))(x, w, wg, wu, wd)
    for mo in (1.0, 0.0):  # capacity + overflow, then the pure block scheme
        ours_fn = lambda *a: expert_ffn(*a, impl="block", block_size=block, capacity=capacity, max_overflow=mo)
        ours = jax.jit(jax.grad(loss(ours_fn), argnums=(0, 1, 2, 3, 4)))(x, w, wg, wu, wd)
        for name, g, r in zip(("x", "top_w", "w_gate", "w_up", "w_down"), ours, ref):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5, err_msg=f"{name} {mo}")


def test_capacity_and_overflow_in_bfloat16():
    args, capacity, block = _split("skewed", 13, d=64, f=32)
    bf = [a if a.dtype == np.int32 else jnp.asarray(a, jnp.bfloat16) for a in args]
    kw = dict(impl="block", block_size=block, capacity=capacity, max_overflow=1.0)
    got = jax.jit(lambda *a: expert_ffn(*a, **kw))(*bf)
    assert got.dtype == jnp.bfloat16
    ref = _numpy_reference(*[np.asarray(jnp.asarray(a, jnp.float32)) if a.dtype != np.int32 else a for a in bf])
    np.testing.assert_allclose(np.asarray(got, np.float32), ref, rtol=2e-2, atol=2e-2)
    ours = lambda x, g: expert_ffn(x, bf[1], bf[2], g, *bf[4:], **kw)
    grads = jax.jit(jax.grad(lambda x, g: jnp.sum(ours(x, g).astype(jnp.float32)), argnums=(0, 1)))(bf[0], bf[3])
    assert [g.dtype for g in grads] == [jnp.bfloat16, jnp.bfloat16]
    ref_g = jax.grad(lambda x, g: jnp.sum(_dense_jax_reference(x, args[1], args[2], g, *args[4:])), argnums=(0, 1))(
        *[jnp.asarray(jnp.asarray(a, jnp.bfloat16), jnp.float32) for a in (args[0], args[3])])
    for g, r in zip(grads, ref_g):  # bf16 operands (dh, du rounded): error relative to the gradient's scale
        assert np.abs(np.asarray(g, np.float32) - np.asarray(r)).max() <= 2e-2 * np.abs(np.asarray(r)).max()


def test_capacity_and_overflow_with_layer_index(kind="all_to_one"):
    """layer= (in-place loops over both parts) equals the reference on that layer's weights, values and grads."""
    layers = [_split(kind, seed)[0] for seed in (21, 22)]
    (x, idx, w, *_), (_, capacity, block) = layers[0], _split(kind, 21)
    stacks = [np.stack([a[i] for a in layers]) for i in (3, 4, 5)]
    kw = dict(impl="block", layer=None, block_size=block, capacity=capacity, max_overflow=1.0)
    run = lambda l, *ws: expert_ffn(x, idx, w, *ws, **{**kw, "layer": l})
    for l in range(2):
        np.testing.assert_allclose(np.asarray(jax.jit(run)(jnp.int32(l), *stacks)),
                                   _numpy_reference(x, idx, w, *layers[l][3:]), rtol=1e-5, atol=1e-5)
    grads = jax.grad(lambda *ws: jnp.sum(run(jnp.int32(1), *ws) ** 2), argnums=(0, 1, 2))(*stacks)
    ref = jax.grad(lambda *ws: jnp.sum(_dense_jax_reference(x, idx, w, *ws) ** 2), argnums=(0, 1, 2))(*layers[1][3:])
    for g, r in zip(grads, ref):
        np.testing.assert_allclose(np.asarray(g[1]), np.asarray(r), rtol=1e-4, atol=1e-5)
        assert not np.any(np.asarray(g[0]))  # the other layer's weights get no gradient


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=12), st.integers(0, 24), st.integers(1, 9))
def test_overflow_block_bound_covers_every_routing(sizes, capacity, block):
    """Σ_e ⌈max(c_e − C, 0)/b⌉ never exceeds the static count of overflow blocks."""
    m = sum(sizes)
    need = sum(-(-max(c - capacity, 0) // block) for c in sizes)
    assert need <= moe_dispatch._num_blocks(max(m, 1), len(sizes), capacity, block)


def test_block_compute_grows_with_assignments_not_experts():
    """Compiled FLOPs of the capacity path at E = 64 match E = 8 for the same N·X (a dense path would be 8×)."""
    n, x_per_tok, d, f = 256, 4, 32, 16

    def flops(e):
        s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
        fn = jax.jit(lambda *a: expert_ffn(*a, impl="block"))
        cost = fn.lower(s(n, d), jax.ShapeDtypeStruct((n, x_per_tok), jnp.int32), s(n, x_per_tok), s(e, d, f),
                        s(e, d, f), s(e, f, d)).compile().cost_analysis()
        return (cost[0] if isinstance(cost, list) else cost)["flops"]

    assert default_capacity(n * x_per_tok, 64) > 0
    assert flops(64) < 1.2 * flops(8)
