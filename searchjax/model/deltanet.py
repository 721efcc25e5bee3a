"""Gated DeltaNet (QWEN35.md §3.4): causal depthwise conv, the gated delta rule (chunked and recurrent), the layer.

Gated delta rule, per value head, state S ∈ R^{Dk×Dv} (fp32):
    S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,   α_t = exp(g_t),   o_t = S_tᵀ q_t.
`chunked_delta_rule` computes the same thing C tokens at a time with the UT transform (prefill/training);
`recurrent_delta_step` is one token (decode). A token with k = 0, β = 0 and g = 0 leaves S unchanged, which is
how right-padding is made inert.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from searchjax.model.config import ModelConfig
from searchjax.model.layers import gated_rms_norm, segment_starts

F32 = jnp.float32


def l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x·rsqrt(Σx² + eps) over the last axis (fixed eps 1e-6, as the HF/FLA kernels)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def causal_conv(x: jax.Array, w: jax.Array, state: jax.Array, valid_len: jax.Array, seg: jax.Array | None = None):
    """Depthwise causal conv + SiLU over time, continuing from `state`.

    x [B,T,...] new inputs; w [Kc,...]; state [B,Kc,...] the previous Kc inputs (zeros at sequence start).
    out[t] = silu(Σ_j w[j]·full[t+1+j]) with full = concat(state, x); the new state is the last Kc *valid* inputs,
    full[n_b : n_b+Kc] for valid_len n_b (right-padded rows). Computed in the weight dtype (HF conv1d).
    seg [B,T] (packed rows, state zero): input s enters out[t] only if seg[s] = seg[t], so each segment's conv
    starts from zeros as it would alone.
    """
    kc, t = w.shape[0], x.shape[1]
    full = jnp.concatenate([state.astype(x.dtype), x], axis=1)
    if seg is None:
        acc = sum(full[:, 1 + j: 1 + j + t].astype(F32) * w[j].astype(F32) for j in range(kc))
    else:
        segs = jnp.concatenate([jnp.full((seg.shape[0], kc), -1, seg.dtype), seg], axis=1)
        same = [(segs[:, 1 + j: 1 + j + t] == seg).reshape(seg.shape + (1,) * (x.ndim - 2)) for j in range(kc)]
        acc = sum(jnp.where(same[j], full[:, 1 + j: 1 + j + t].astype(F32), 0.0) * w[j].astype(F32)
                  for j in range(kc))
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


@jax.custom_vjp
def _inverse(strict: jax.Array) -> jax.Array:
    """`unit_lower_inverse` with its gradient in closed form: for L = (I + A)⁻¹, dL = −L dA L, so the
    cotangent of the strictly lower A is tril(−Lᵀ L̄ Lᵀ, −1) (two matmuls instead of pulling back every
    doubling level)."""
    return unit_lower_inverse(strict)


def _inverse_fwd(strict):
    inv = unit_lower_inverse(strict)
    return inv, inv


def _inverse_bwd(inv, ct):
    inv_t = jnp.swapaxes(inv, -1, -2)
    return (jnp.tril(-(inv_t @ ct @ inv_t), -1),)


_inverse.defvjp(_inverse_fwd, _inverse_bwd)


def _expand_heads(q, k, nv):
    """Key head i serves value heads i·r … i·r+r−1 (consecutive; HF repeat_interleave)."""
    r = nv // q.shape[2]
    return jnp.repeat(q, r, axis=2), jnp.repeat(k, r, axis=2)


def _chunk_step(s, q, k, v, g, beta, reset=None):
    """One chunk of the UT-transform recursion for every (batch·head) row: s [R,Dk,Dv]; q, k [R,C,Dk], v [R,C,Dv],
    g/beta [R,C]; reset [R,C] (packed rows: 1 where a segment starts). Returns (new s, o [R,C,Dv]); see
    `chunked_delta_rule` for the maths."""
    c, dv = k.shape[1], v.shape[-1]
    gam = jnp.cumsum(g, axis=-1)
    lower = jnp.tril(jnp.ones((c, c), bool))
    if reset is None:
        decay = jnp.exp(jnp.where(lower, gam[..., :, None] - gam[..., None, :], -jnp.inf))
        kb, eg = k * beta[..., None], jnp.exp(gam)[..., None]
        tail, carry = jnp.exp(gam[..., -1:] - gam), jnp.exp(gam[..., -1])
    else:  # n = segments started in the chunk up to t: tokens interact iff their n agree; S enters where n = 0
        n = jnp.cumsum(reset, axis=-1)
        same = lower & (n[..., :, None] == n[..., None, :])
        decay = jnp.exp(jnp.where(same, gam[..., :, None] - gam[..., None, :], -jnp.inf))
        kb, eg = k * beta[..., None], jnp.where(n == 0, jnp.exp(gam), 0.0)[..., None]
        tail = jnp.where(n == n[..., -1:], jnp.exp(gam[..., -1:] - gam), 0.0)
        carry = jnp.where(n[..., -1] == 0, jnp.exp(gam[..., -1]), 0.0)
    a = jnp.concatenate([kb, q], 1) @ jnp.swapaxes(k, 1, 2)  # [K_β; Q] Kᵀ in one matmul
    strict, aqk = jnp.tril(a[:, :c] * decay, -1), a[:, c:] * decay
    uw = _inverse(strict) @ jnp.concatenate([v * beta[..., None], kb * eg], -1)  # [U | W]
    ws = jnp.concatenate([uw[..., dv:], q * eg], 1) @ s  # [W S; (Q⊙e^γ) S]
    v_new = uw[..., :dv] - ws[:, :c]
    o = ws[:, c:] + aqk @ v_new
    kd = k * tail[..., None]
    return s * carry[..., None, None] + jnp.swapaxes(kd, 1, 2) @ v_new, o


def chunked_delta_rule(q, k, v, g, beta, state, chunk: int, seg: jax.Array | None = None):
    """Chunked gated delta rule (§3.4, HF torch_chunk_gated_delta_rule), all fp32.

    q, k [B,T,Nv,Dk] (l2-normed, q already scaled), v [B,T,Nv,Dv], g/beta [B,T,Nv], state [B,Nv,Dk,Dv].
    Per chunk (C a power of two) with γ = cumsum(g), D_ij = exp(γ_i−γ_j)·[i≥j]:
    A = I + strict_lower((K_β Kᵀ)⊙D),
    U = A⁻¹V_β, W = A⁻¹(K_β⊙e^γ);  v' = U − W S,  O = (Q⊙e^γ) S + ((QKᵀ)⊙D) v',
    S ← e^{γ_C} S + (K⊙e^{γ_C−γ})ᵀ v'. Returns (o [B,T,Nv,Dv] fp32, final state fp32).
    Each chunk is computed whole inside one loop step (batch·heads folded into one row axis), reading its slice of
    the inputs in place and writing its output slice in place: on CPU, keeping a chunk's intermediates in cache
    beats precomputing them batched over all chunks (those [chunks, rows, C, ·] buffers fall out of cache), and
    transposing whole inputs into chunk-major order costs more than the loop saves. The gradient is
    `_delta_rule_bwd`: a reverse loop over chunks that recomputes each chunk from its stored start state.

    Packed rows (seg [B,T] segment ids, `state` zero): S is reset to 0 before the first token of every segment,
    S_t = β_t k_t v_tᵀ there, so each segment's outputs are those it would have alone. Inside a chunk, with
    n_t = the number of segments started in the chunk up to t, D_ij is kept only where n_i = n_j, the chunk's
    start state enters only where n = 0, and the carried state keeps only the last segment's tokens.
    """
    b, t, nv, dk = k.shape
    dv, pad = v.shape[-1], (-t) % chunk
    xs = tuple(x.astype(F32) for x in (q, k, v, g, beta))
    if seg is not None:
        xs = xs + (jnp.broadcast_to(segment_starts(seg).astype(F32)[..., None], (b, t, nv)),)
    if pad:
        xs = tuple(jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)) for x in xs)
    o, state = _delta_rule(xs, state.astype(F32).reshape(b * nv, dk, dv), chunk)
    return o[:, :t], state.reshape(b, nv, dk, dv)


def _rows(x, i, chunk):
    """Chunk i of x [B,T,Nv,...] as rows [B·Nv, C, ...] (batch·heads folded)."""
    x = jnp.swapaxes(jax.lax.dynamic_slice_in_dim(x, i * chunk, chunk, 1), 1, 2)
    return x.reshape((-1, chunk) + x.shape[3:])


def _put_rows(buf, rows, i, chunk):
    """Write rows [B·Nv, C, ...] as chunk i of buf [B,T,Nv,...] (in place inside a loop)."""
    b, nv = buf.shape[0], buf.shape[2]
    x = jnp.swapaxes(rows.reshape((b, nv, chunk) + rows.shape[2:]), 1, 2)
    return jax.lax.dynamic_update_slice_in_dim(buf, x.astype(buf.dtype), i * chunk, 1)


def _delta_rule_loop(xs, s0, chunk: int, keep_states: bool):
    """Forward loop over chunks: (o [B,T,Nv,Dv], final s [R,Dk,Dv], start state of every chunk [N,R,Dk,Dv] or None).
    T is a multiple of chunk."""
    n = xs[0].shape[1] // chunk
    o = jnp.zeros(xs[2].shape, F32)
    states = jnp.zeros((n,) + s0.shape, F32) if keep_states else None

    def body(i, carry):
        s, o, states = carry
        if keep_states:
            states = jax.lax.dynamic_update_index_in_dim(states, s, i, 0)
        s_next, o_c = _chunk_step(s, *(_rows(x, i, chunk) for x in xs))
        return s_next, _put_rows(o, o_c, i, chunk), states

    s, o, states = jax.lax.fori_loop(0, n, body, (s0, o, states))
    return o, s, states


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _delta_rule(xs, s0, chunk: int):
    """The chunk loop on fp32 inputs xs = (q, k, v, g, β[, reset]) whose length is a multiple of chunk;
    s0 [B·Nv,Dk,Dv]. Returns (o, final s)."""
    o, s, _ = _delta_rule_loop(xs, s0, chunk, keep_states=False)
    return o, s


def _delta_rule_fwd(xs, s0, chunk: int):
    o, s, states = _delta_rule_loop(xs, s0, chunk, keep_states=True)
    return (o, s), (xs, states)


def _delta_rule_bwd(chunk: int, res, cts):
    """Reverse loop over chunks: chunk i is recomputed from its stored start state S_i and pulled back,
    (dS_i, dq_i, dk_i, dv_i, dg_i, dβ_i) = vjp(_chunk_step at S_i)(dS_{i+1}, dO_i), starting from dS_N = the
    final state's cotangent. Memory is one state per chunk, not every chunk's intermediates."""
    xs, states = res
    do, ds = cts

    def body(j, carry):
        i = states.shape[0] - 1 - j
        ds, grads = carry
        _, pull = jax.vjp(_chunk_step, states[i], *(_rows(x, i, chunk) for x in xs))
        ds, *d_rows = pull((ds, _rows(do, i, chunk)))
        return ds, tuple(_put_rows(d, r, i, chunk) for d, r in zip(grads, d_rows))

    grads = tuple(jnp.zeros_like(x) for x in xs)
    ds, grads = jax.lax.fori_loop(0, states.shape[0], body, (ds, grads))
    return grads, ds


_delta_rule.defvjp(_delta_rule_fwd, _delta_rule_bwd)


def recurrent_delta_step(q, k, v, g, beta, state):
    """One token of the gated delta rule (§3.4), fp32: q, k [B,Nv,Dk], v [B,Nv,Dv], g/beta [B,Nv], S [B,Nv,Dk,Dv].

    S' = e^g S + k ⊗ δ with δ = β(v − e^g Sᵀk), and o = S'ᵀq = e^g Sᵀq + (k·q) δ: the products Sᵀk and Sᵀq come
    from one read of the old state and S' is written in one pass (the step is memory-bound). Returns (o, S').
    """
    q, k, v, g, beta = (x.astype(F32) for x in (q, k, v, g, beta))
    a = jnp.exp(g)[..., None]
    sk, sq = jnp.einsum("bnkv,bnjk->jbnv", state, jnp.stack([k, q], 2))
    delta = (v - a * sk) * beta[..., None]
    o = a * sq + jnp.sum(k * q, -1, keepdims=True) * delta
    return o, state * a[..., None] + k[..., :, None] * delta[..., None, :]


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


def deltanet(p, x, valid, conv_state, rec_state, cfg: ModelConfig, seg: jax.Array | None = None):
    """Gated DeltaNet over a chunk of tokens (chunked algorithm), continuing from conv/recurrent states.

    x [B,T,D]; valid [B,T] (right-padded: a prefix of each row); conv_state = (q, k, v) previous Kc pre-conv
    inputs [B,Kc,·,·]; rec_state [B,Nv,Dk,Dv] fp32. Returns (out [B,T,D], new conv_state, new rec_state).
    seg [B,T]: segment ids of packed rows (zero starting states): conv and delta rule restart at every segment.
    """
    qkv, z, beta, g = _projections(p, x, cfg)
    n = jnp.sum(valid, axis=1)
    conv = [causal_conv(t, w, s, n, seg) for t, w, s in zip(qkv, (p.conv_q, p.conv_k, p.conv_v), conv_state)]
    qkv, conv_state = tuple(c[0] for c in conv), tuple(c[1] for c in conv)
    q, k, v, g, beta = _prepare(qkv, beta, g, valid, cfg.linear_num_value_heads)
    o, rec_state = chunked_delta_rule(q, k, v, g, beta, rec_state, cfg.chunk_size, seg)
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
