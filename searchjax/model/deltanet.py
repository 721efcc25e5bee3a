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


def _neumann_inverse(lower: jax.Array) -> jax.Array:
    """(I + L)⁻¹ = Π_{i<log2 n} (I + (−L)^{2^i}) for strictly lower L [..., n, n] (n a power of two; L^n = 0).

    The product telescopes to Σ_{j<n} (−L)^j: 2·log2(n) batched matmuls, no slicing.
    """
    p = -lower
    inv = jnp.eye(lower.shape[-1], dtype=lower.dtype) + p
    for _ in range(lower.shape[-1].bit_length() - 2):
        p = p @ p
        inv = inv + inv @ p
    return inv


def unit_lower_inverse(strict: jax.Array, base: int = 8) -> jax.Array:
    """(I + L)⁻¹ for L = strictly lower part of `strict` [..., C, C] (C a power of two), by blockwise doubling.

    Diagonal blocks of size min(C, base) are inverted with `_neumann_inverse`; then the blocks double in size each
    level: for (I+L) = [[A, 0], [B, D]], (I+L)⁻¹ = [[A⁻¹, 0], [−D⁻¹ B A⁻¹, D⁻¹]]. Only matmuls, no LAPACK call:
    jaxlib's CPU triangular solve can deadlock the XLA thread pool on small machines, and this is faster.
    """
    c = strict.shape[-1]
    if c & (c - 1):
        raise ValueError(f"unit_lower_inverse: size {c} is not a power of two")
    n = min(c, base)
    diag = strict if n == c else jnp.stack([strict[..., j:j + n, j:j + n] for j in range(0, c, n)], -3)
    blocks = _neumann_inverse(jnp.tril(diag.reshape(strict.shape[:-2] + (c // n, n, n)), -1))
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


def _chunk_step(s, q, k, v, g, beta):
    """One chunk of the UT-transform recursion for every (batch·head) row: s [R,Dk,Dv]; q, k [R,C,Dk], v [R,C,Dv],
    g/beta [R,C]. Returns (new s, o [R,C,Dv]); see `chunked_delta_rule` for the maths."""
    c, dv = k.shape[1], v.shape[-1]
    gam = jnp.cumsum(g, axis=-1)
    lower = jnp.tril(jnp.ones((c, c), bool))
    decay = jnp.exp(jnp.where(lower, gam[..., :, None] - gam[..., None, :], -jnp.inf))
    kb, eg = k * beta[..., None], jnp.exp(gam)[..., None]
    a = jnp.concatenate([kb, q], 1) @ jnp.swapaxes(k, 1, 2)  # [K_β; Q] Kᵀ in one matmul
    strict, aqk = jnp.tril(a[:, :c] * decay, -1), a[:, c:] * decay
    uw = unit_lower_inverse(strict) @ jnp.concatenate([v * beta[..., None], kb * eg], -1)  # [U | W]
    ws = jnp.concatenate([uw[..., dv:], q * eg], 1) @ s  # [W S; (Q⊙e^γ) S]
    v_new = uw[..., :dv] - ws[:, :c]
    o = ws[:, c:] + aqk @ v_new
    kd = k * jnp.exp(gam[..., -1:] - gam)[..., None]
    return s * jnp.exp(gam[..., -1])[..., None, None] + jnp.swapaxes(kd, 1, 2) @ v_new, o


def chunked_delta_rule(q, k, v, g, beta, state, chunk: int):
    """Chunked gated delta rule (§3.4, HF torch_chunk_gated_delta_rule), all fp32.

    q, k [B,T,Nv,Dk] (l2-normed, q already scaled), v [B,T,Nv,Dv], g/beta [B,T,Nv], state [B,Nv,Dk,Dv].
    Per chunk (C a power of two) with γ = cumsum(g), D_ij = exp(γ_i−γ_j)·[i≥j]:
    A = I + strict_lower((K_β Kᵀ)⊙D),
    U = A⁻¹V_β, W = A⁻¹(K_β⊙e^γ);  v' = U − W S,  O = (Q⊙e^γ) S + ((QKᵀ)⊙D) v',
    S ← e^{γ_C} S + (K⊙e^{γ_C−γ})ᵀ v'. Returns (o [B,T,Nv,Dv] fp32, final state fp32).
    Each chunk is computed whole inside one loop step (batch·heads folded into one row axis), reading its slice of
    the inputs in place and writing its output slice in place: on CPU, keeping a chunk's intermediates in cache
    beats precomputing them batched over all chunks, and transposing whole inputs into chunk-major order costs more
    than the loop saves.
    """
    b, t, nv, dk = k.shape
    dv, pad = v.shape[-1], (-t) % chunk
    xs = tuple(x.astype(F32) for x in (q, k, v, g, beta))
    if pad:
        xs = tuple(jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)) for x in xs)

    def body(i, carry):
        s, o = carry
        rows = (jnp.swapaxes(jax.lax.dynamic_slice_in_dim(x, i * chunk, chunk, 1), 1, 2)
                .reshape((b * nv, chunk) + x.shape[3:]) for x in xs)  # [B·Nv, C, ...]
        s, o_c = _chunk_step(s, *rows)
        o_c = jnp.swapaxes(o_c.reshape(b, nv, chunk, dv), 1, 2)
        return s, jax.lax.dynamic_update_slice_in_dim(o, o_c, i * chunk, 1)

    init = (state.astype(F32).reshape(b * nv, dk, dv), jnp.zeros((b, t + pad, nv, dv), F32))
    state, o = jax.lax.fori_loop(0, (t + pad) // chunk, body, init)
    return o[:, :t], state.reshape(b, nv, dk, dv)


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
