"""Gated delta rule: chunked ≡ recurrent ≡ a float64 numpy loop; padding is inert; conv state continues."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.model.deltanet import (_inverse, causal_conv, chunked_delta_rule, l2norm, recurrent_delta_step,
                                      unit_lower_inverse)


def inputs(seed, b=2, t=13, nv=3, dk=4, dv=5):
    ks = jax.random.split(jax.random.key(seed), 6)
    q = l2norm(jax.random.normal(ks[0], (b, t, nv, dk))) * dk ** -0.5
    k = l2norm(jax.random.normal(ks[1], (b, t, nv, dk)))
    v = jax.random.normal(ks[2], (b, t, nv, dv))
    g = -jax.nn.softplus(jax.random.normal(ks[3], (b, t, nv)))
    beta = jax.nn.sigmoid(jax.random.normal(ks[4], (b, t, nv)))
    s0 = 0.3 * jax.random.normal(ks[5], (b, nv, dk, dv))
    return q, k, v, g, beta, s0


def numpy_delta_rule(q, k, v, g, beta, s):
    """S ← e^g S;  S ← S + k ⊗ β(v − Sᵀk);  o = Sᵀq, token by token in float64."""
    q, k, v, g, beta, s = (np.asarray(x, np.float64) for x in (q, k, v, g, beta, s))
    out = np.zeros(v.shape)
    for t in range(q.shape[1]):
        s = s * np.exp(g[:, t])[..., None, None]
        delta = (v[:, t] - np.einsum("bnkv,bnk->bnv", s, k[:, t])) * beta[:, t][..., None]
        s = s + k[:, t][..., :, None] * delta[..., None, :]
        out[:, t] = np.einsum("bnkv,bnk->bnv", s, q[:, t])
    return out, s


@jax.jit
def recurrent(q, k, v, g, beta, s):
    """recurrent_delta_step applied token by token."""

    def step(s, xs):
        o, s = recurrent_delta_step(*xs, s)
        return s, o

    s, o = jax.lax.scan(step, s, tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta)))
    return jnp.moveaxis(o, 0, 1), s


chunked = jax.jit(chunked_delta_rule, static_argnums=6)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 1000), t=st.sampled_from([1, 5, 21]), chunk=st.sampled_from([1, 4, 64]))
def test_chunked_equals_recurrent_equals_numpy(seed, t, chunk):
    q, k, v, g, beta, s0 = inputs(seed, t=t)
    ref_o, ref_s = numpy_delta_rule(q, k, v, g, beta, s0)
    o_c, s_c = chunked(q, k, v, g, beta, s0, chunk)
    o_r, s_r = recurrent(q, k, v, g, beta, s0)
    for o, s in ((o_c, s_c), (o_r, s_r)):
        np.testing.assert_allclose(o, ref_o, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(s, ref_s, rtol=1e-5, atol=1e-5)


def test_chunks_compose():
    """Running two halves with the state carried over equals one run (the prefill continuation path)."""
    q, k, v, g, beta, s0 = inputs(3, t=20)
    o_full, s_full = chunked(q, k, v, g, beta, s0, 8)
    o1, s1 = chunked(*(x[:, :7] for x in (q, k, v, g, beta)), s0, 8)
    o2, s2 = chunked(*(x[:, 7:] for x in (q, k, v, g, beta)), s1, 8)
    np.testing.assert_allclose(jnp.concatenate([o1, o2], 1), o_full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s2, s_full, rtol=1e-5, atol=1e-5)


def test_zero_k_beta_g_tokens_leave_state_unchanged():
    q, k, v, g, beta, s0 = inputs(4, t=9)
    pad = jnp.arange(9) >= 5
    k = jnp.where(pad[None, :, None, None], 0.0, k)
    g, beta = (jnp.where(pad[None, :, None], 0.0, x) for x in (g, beta))
    _, s_pad = chunked(q, k, v, g, beta, s0, 4)
    _, s_5 = chunked(*(x[:, :5] for x in (q, k, v, g, beta)), s0, 4)
    np.testing.assert_allclose(s_pad, s_5, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("valid_len", [0, 2, 6])
def test_causal_conv_matches_direct_and_keeps_last_valid_inputs(valid_len):
    kc, t = 4, 6
    x = jax.random.normal(jax.random.key(0), (2, t, 3, 5))
    w = jax.random.normal(jax.random.key(1), (kc, 3, 5))
    state = jax.random.normal(jax.random.key(2), (2, kc, 3, 5))
    out, new_state = causal_conv(x, w, state, jnp.array([valid_len, t]))
    full = np.concatenate([np.asarray(state), np.asarray(x)], axis=1)
    ref = np.stack([sum(np.asarray(w)[j] * full[:, s + 1 + j] for j in range(kc)) for s in range(t)], axis=1)
    np.testing.assert_allclose(out, jax.nn.silu(ref), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(new_state[0], full[0, valid_len: valid_len + kc])
    np.testing.assert_array_equal(new_state[1], full[1, t: t + kc])


@pytest.mark.parametrize("similar,base", [(False, 1), (False, 8), (False, 64), (True, 1), (True, 8)])
def test_unit_lower_inverse_matches_float64(similar, base):
    """(I + strict_lower(A))⁻¹ vs numpy float64, for random and near-identical keys: block doubling from 1×1 or
    8×8 Neumann-product blocks, and the Neumann product alone (base 64; unstable for near-identical keys)."""
    c, dk = 64, 16
    k = np.random.default_rng(0).normal(size=(3, c, dk))
    if similar:  # keys nearly parallel, β ≈ 1, no decay: the worst-conditioned realistic case
        k = k[:, :1] + 0.05 * k
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    beta = 0.95 if similar else np.random.default_rng(1).uniform(size=(3, c, 1))
    a = np.tril((k * beta) @ np.swapaxes(k, -1, -2), -1)
    ref = np.linalg.inv(np.eye(c) + a)
    got = np.asarray(unit_lower_inverse(jnp.asarray(a, jnp.float32), base), np.float64)
    assert np.abs(got - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())
    np.testing.assert_allclose(got @ (np.eye(c) + a), np.broadcast_to(np.eye(c), got.shape), atol=1e-4)


@pytest.mark.parametrize("chunk", [8, 16, 32, 64])
def test_chunk_sizes_match_recurrent_with_ragged_length_and_initial_state(chunk):
    """T=45 is no multiple of any chunk size (the last chunk is padded); the initial state is nonzero."""
    q, k, v, g, beta, s0 = inputs(11, b=2, t=45, nv=2, dk=8, dv=6)
    o_c, s_c = chunked(q, k, v, g, beta, s0, chunk)
    o_r, s_r = recurrent(q, k, v, g, beta, s0)
    np.testing.assert_allclose(o_c, o_r, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s_c, s_r, rtol=1e-5, atol=1e-5)


def _loss(rule):
    """A loss that reaches every output: weighted outputs and the final state (fixed random weights)."""

    def loss(q, k, v, g, beta, s0):
        o, s = rule(q, k, v, g, beta, s0)
        wo = jax.random.normal(jax.random.key(7), o.shape)
        ws = jax.random.normal(jax.random.key(8), s.shape)
        return jnp.sum(wo * o) + jnp.sum(ws * s)

    return jax.jit(jax.grad(loss, argnums=tuple(range(6))))


def test_chunked_gradient_equals_recurrent_gradient(chunk=8, t=21):
    """The chunked rule's custom backward (reverse chunk loop) against autodiff through the token scan, for the
    gradients of q, k, v, g, β and the initial state (three chunks, the last one padded)."""
    xs = inputs(5, b=2, t=t, nv=2, dk=8, dv=6)
    got = _loss(lambda *a: chunked(*a, chunk))(*xs)
    want = _loss(recurrent)(*xs)
    for name, a, b in zip(("q", "k", "v", "g", "beta", "state"), got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)


def test_bf16_inputs_follow_fp32_and_gradients_keep_input_dtypes():
    """bf16 inputs are computed in fp32 (the result equals the fp32 rule on the rounded inputs) and their
    gradients come back in bf16."""
    xs = inputs(6, b=1, t=24, nv=2, dk=8, dv=6)
    low = tuple(x.astype(jnp.bfloat16) for x in xs[:5]) + (xs[5],)
    o_b, s_b = chunked(*low, 8)
    o_f, s_f = recurrent(*(x.astype(jnp.float32) for x in low))
    assert o_b.dtype == s_b.dtype == jnp.float32
    np.testing.assert_allclose(o_b, o_f, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s_b, s_f, rtol=1e-5, atol=1e-5)
    grads = jax.grad(lambda *a: jnp.sum(chunked_delta_rule(*a, 8)[0] ** 2), argnums=tuple(range(6)))(*low)
    assert [d.dtype for d in grads] == [x.dtype for x in low]


def test_inverse_closed_form_gradient_equals_autodiff():
    """_inverse's custom gradient tril(−Lᵀ L̄ Lᵀ, −1) equals autodiff through unit_lower_inverse's doubling levels
    (C=32: 8×8 Neumann blocks and two doubling levels)."""
    a = 0.3 * jax.random.normal(jax.random.key(0), (3, 32, 32))
    w = jax.random.normal(jax.random.key(1), (3, 32, 32))
    got = jax.grad(lambda a: jnp.sum(w * _inverse(a)))(a)
    want = jax.grad(lambda a: jnp.sum(w * unit_lower_inverse(a)))(a)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
