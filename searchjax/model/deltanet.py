"""Gated DeltaNet (QWEN35.md §3.4): causal depthwise conv, the gated delta rule (chunked and recurrent), the layer.

Gated delta rule, per value head, state S ∈ R^{Dk×Dv} (fp32):
    S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,   α_t = exp(g_t),   o_t = S_tᵀ q_t.
`chunked_delta_rule` computes the same thing C tokens at a time with the UT transform (prefill/training);
`recurrent_delta_step` is one token (decode). A token with k = 0, β = 0 and g = 0 leaves S unchanged, which is
how right-padding is made inert.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Not called here any more (see unit_lower_inverse). tests/model/test_sharding.py, test_multihost.py and
# tools/bench_model.py (helper M2's files) still monkeypatch this module attribute; remove once they stop.
from jax.scipy.linalg import solve_triangular  # noqa: F401

from searchjax.model.config import ModelConfig
from searchjax.model.layers import gated_rms_norm

F32 = jnp.float32


def l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x·rsqrt(Σx² + eps) over the last axis (fixed eps 1e-6, as the HF/FLA kernels)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def causal_conv(x: jax.Array, w: jax.Array, state: jax.Array, valid_len: jax.Array):
    """Depthwise causal conv + SiLU over time, continuing from `state`.

    x [B,T,...] new inputs; w [Kc,...]; state [B,Kc,...] the previous Kc inputs (zeros at sequence start).
    out[t] = silu(Σ_j w[j]·full[t+1+j]) with full = concat(state, x); the new state is the last Kc *valid* inputs,
    full[n_b : n_b+Kc] for valid_len n_b (right-padded rows). Computed in the weight dtype (HF conv1d).
    """
    kc, t = w.shape[0], x.shape[1]
    full = jnp.concatenate([state.astype(x.dtype), x], axis=1)
    acc = sum(full[:, 1 + j: 1 + j + t].astype(F32) * w[j].astype(F32) for j in range(kc))
    out = jax.nn.silu(acc.astype(w.dtype))
    take = lambda f, n: jax.lax.dynamic_slice_in_dim(f, n, kc, axis=0)  # noqa: E731
    new_state = jax.vmap(take)(full, valid_len.astype(jnp.int32))
    return out.astype(x.dtype), new_state.astype(state.dtype)


def unit_lower_inverse(strict: jax.Array) -> jax.Array:
    """(I + L)⁻¹ for L = strictly lower part of `strict` [..., C, C] (C a power of two), by blockwise doubling.

    Diagonal blocks of the inverse double in size each level: for (I+L) = [[A, 0], [B, D]],
    (I+L)⁻¹ = [[A⁻¹, 0], [−D⁻¹ B A⁻¹, D⁻¹]]. Only matmuls (log2 C levels), no LAPACK call: jaxlib's CPU
    triangular solve can deadlock the XLA thread pool on small machines, and this is faster for C = 64.
    """
    c = strict.shape[-1]
    if c & (c - 1):
        raise ValueError(f"unit_lower_inverse: size {c} is not a power of two")
    blocks = jnp.ones(strict.shape[:-2] + (c, 1, 1), strict.dtype)  # [..., C/n, n, n] diagonal blocks
    n = 1
    while n < c:
        m = c // (2 * n)
        off = jnp.stack([strict[..., j * 2 * n + n:(j + 1) * 2 * n, j * 2 * n:j * 2 * n + n] for j in range(m)], -3)
        a, d = blocks[..., 0::2, :, :], blocks[..., 1::2, :, :]
        lower = -jnp.einsum("...ij,...jk,...kl->...il", d, off, a)
        top = jnp.concatenate([a, jnp.zeros_like(a)], axis=-1)
        bottom = jnp.concatenate([lower, d], axis=-1)
        blocks = jnp.concatenate([top, bottom], axis=-2)
        n *= 2
    return blocks[..., 0, :, :]


def _expand_heads(q, k, nv):
    """Key head i serves value heads i·r … i·r+r−1 (consecutive; HF repeat_interleave)."""
    r = nv // q.shape[2]
    return jnp.repeat(q, r, axis=2), jnp.repeat(k, r, axis=2)


def chunked_delta_rule(q, k, v, g, beta, state, chunk: int):
    """Chunked gated delta rule (§3.4, HF torch_chunk_gated_delta_rule), all fp32.

    q, k [B,T,Nv,Dk] (l2-normed, q already scaled), v [B,T,Nv,Dv], g/beta [B,T,Nv], state [B,Nv,Dk,Dv].
    Per chunk (C a power of two) with γ = cumsum(g), D_ij = exp(γ_i−γ_j)·[i≥j]:
    A = I + strict_lower((K_β Kᵀ)⊙D),
    U = A⁻¹V_β, W = A⁻¹(K_β⊙e^γ); then over chunks  v' = U − W S,  O = (Q⊙e^γ) S + ((QKᵀ)⊙D) v',
    S ← e^{γ_C} S + (K⊙e^{γ_C−γ})ᵀ v'. Returns (o [B,T,Nv,Dv] fp32, final state fp32).
    """
    b, t, nv, dk = k.shape
    pad = (-t) % chunk
    tr = lambda x: jnp.moveaxis(x.astype(F32), 1, 2)  # noqa: E731  [B,Nv,T,...]
    q, k, v, g, beta = (jnp.pad(tr(x), [(0, 0), (0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 3))
                        for x in (q, k, v, g, beta))
    nc = (t + pad) // chunk
    q, k, v = (x.reshape(b, nv, nc, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = (x.reshape(b, nv, nc, chunk) for x in (g, beta))
    gam = jnp.cumsum(g, axis=-1)
    lower = jnp.tril(jnp.ones((chunk, chunk), bool))
    decay = jnp.exp(jnp.where(lower, gam[..., :, None] - gam[..., None, :], -jnp.inf))
    kb, vb = k * beta[..., None], v * beta[..., None]
    strict = jnp.tril(jnp.einsum("...ik,...jk->...ij", kb, k) * decay, -1)
    inv = unit_lower_inverse(strict)
    u, w = inv @ vb, inv @ (kb * jnp.exp(gam)[..., None])
    aqk = jnp.einsum("...ik,...jk->...ij", q, k) * decay
    qd = q * jnp.exp(gam)[..., None]
    kd = k * jnp.exp(gam[..., -1:] - gam)[..., None]
    cd = jnp.exp(gam[..., -1])[..., None, None]

    def step(s, xs):  # only the state recursion is sequential; outputs are batched over chunks below
        u_c, w_c, kd_c, cd_c = xs
        v_new = u_c - jnp.einsum("bnck,bnkv->bncv", w_c, s)
        return s * cd_c + jnp.einsum("bnck,bncv->bnkv", kd_c, v_new), (s, v_new)

    xs = tuple(jnp.moveaxis(x, 2, 0) for x in (u, w, kd, cd))
    state, (s_in, v_new) = jax.lax.scan(step, state.astype(F32), xs)
    s_in, v_new = jnp.moveaxis(s_in, 0, 2), jnp.moveaxis(v_new, 0, 2)  # [B,Nv,nc,...]
    o = jnp.einsum("bnmck,bnmkv->bnmcv", qd, s_in) + jnp.einsum("bnmij,bnmjv->bnmiv", aqk, v_new)
    o = o.reshape(b, nv, nc * chunk, -1)[:, :, :t]
    return jnp.moveaxis(o, 1, 2), state


def recurrent_delta_step(q, k, v, g, beta, state):
    """One token of the gated delta rule (§3.4), fp32: q, k [B,Nv,Dk], v [B,Nv,Dv], g/beta [B,Nv], S [B,Nv,Dk,Dv].

    S ← e^g S;  S ← S + k ⊗ β(v − Sᵀk);  o = Sᵀq.   Returns (o [B,Nv,Dv], S).
    """
    q, k, v, g, beta = (x.astype(F32) for x in (q, k, v, g, beta))
    s = state * jnp.exp(g)[..., None, None]
    delta = (v - jnp.einsum("bnkv,bnk->bnv", s, k)) * beta[..., None]
    s = s + k[..., :, None] * delta[..., None, :]
    return jnp.einsum("bnkv,bnk->bnv", s, q), s


def _projections(p, x, cfg: ModelConfig):
    """Pre-conv q/k/v, and z, β = σ(b), g = −exp(A_log)·softplus(a + dt_bias) (fp32)."""
    q = jnp.einsum("BTD,DNH->BTNH", x, p.wq)
    k = jnp.einsum("BTD,DNH->BTNH", x, p.wk)
    v = jnp.einsum("BTD,DNH->BTNH", x, p.wv)
    z = jnp.einsum("BTD,DNH->BTNH", x, p.wz)
    beta = jax.nn.sigmoid(jnp.einsum("BTD,DN->BTN", x, p.wb).astype(F32))
    a = jnp.einsum("BTD,DN->BTN", x, p.wa).astype(F32)
    g = -jnp.exp(p.a_log.astype(F32)) * jax.nn.softplus(a + p.dt_bias.astype(F32))
    return (q, k, v), z, beta, g


def _prepare(qkv, beta, g, valid, nv):
    """l2-normalise q/k, expand key heads, scale q by Dk^-0.5, zero k/β/g on invalid tokens (fp32)."""
    q, k, v = (x.astype(F32) for x in qkv)
    q, k = _expand_heads(l2norm(q), l2norm(k), nv)
    q = q * (q.shape[-1] ** -0.5)
    m = valid.astype(F32)
    return q, k * m[..., None, None], v, g * m[..., None], beta * m[..., None]


def _output(p, o, z, x, cfg: ModelConfig):
    o = gated_rms_norm(o.astype(x.dtype), z, p.norm, cfg.rms_norm_eps)
    return jnp.einsum("BTNH,NHD->BTD", o, p.wo)


def deltanet(p, x, valid, conv_state, rec_state, cfg: ModelConfig):
    """Gated DeltaNet over a chunk of tokens (chunked algorithm), continuing from conv/recurrent states.

    x [B,T,D]; valid [B,T] (right-padded: a prefix of each row); conv_state = (q, k, v) previous Kc pre-conv
    inputs [B,Kc,·,·]; rec_state [B,Nv,Dk,Dv] fp32. Returns (out [B,T,D], new conv_state, new rec_state).
    """
    qkv, z, beta, g = _projections(p, x, cfg)
    n = jnp.sum(valid, axis=1)
    conv = [causal_conv(t, w, s, n) for t, w, s in zip(qkv, (p.conv_q, p.conv_k, p.conv_v), conv_state)]
    qkv, conv_state = tuple(c[0] for c in conv), tuple(c[1] for c in conv)
    q, k, v, g, beta = _prepare(qkv, beta, g, valid, cfg.linear_num_value_heads)
    o, rec_state = chunked_delta_rule(q, k, v, g, beta, rec_state, cfg.chunk_size)
    return _output(p, o, z, x, cfg), conv_state, rec_state


def deltanet_step(p, x, active, conv_state, rec_state, cfg: ModelConfig):
    """One decode token per row with the recurrent rule: x [B,1,D], active [B]; inactive rows keep their states."""
    qkv, z, beta, g = _projections(p, x, cfg)
    conv = [causal_conv(t, w, s, active.astype(jnp.int32))
            for t, w, s in zip(qkv, (p.conv_q, p.conv_k, p.conv_v), conv_state)]
    qkv, conv_state = tuple(c[0] for c in conv), tuple(c[1] for c in conv)
    q, k, v, g, beta = _prepare(qkv, beta, g, active[:, None], cfg.linear_num_value_heads)
    o, new_state = recurrent_delta_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], rec_state)
    rec_state = jnp.where(active[:, None, None, None], new_state, rec_state)
    return _output(p, o[:, None], z, x, cfg), conv_state, rec_state
