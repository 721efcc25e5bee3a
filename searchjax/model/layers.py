"""Norms, RoPE and gated full attention of Qwen3.5 (QWEN35.md §3.2, §3.3). Pure functions of arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from searchjax.model.config import ModelConfig

F32 = jnp.float32


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """Zero-centred RMSNorm (§3.2): y = x·rsqrt(mean(x²)+eps)·(1+w), all in fp32, cast to x.dtype at the end."""
    xf = x.astype(F32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (y * (1.0 + w.astype(F32))).astype(x.dtype)


def gated_rms_norm(o: jax.Array, z: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """DeltaNet output norm (§3.4): w·(o·rsqrt(mean(o²)+eps)) cast to o.dtype, then ×silu(z) in fp32 (PLAIN w)."""
    of = o.astype(F32)
    y = (of * jax.lax.rsqrt(jnp.mean(of * of, axis=-1, keepdims=True) + eps)).astype(o.dtype)
    y = w.astype(o.dtype) * y
    return (y.astype(F32) * jax.nn.silu(z.astype(F32))).astype(o.dtype)


def rope_cos_sin(pos: jax.Array, cfg: ModelConfig, dtype) -> tuple[jax.Array, jax.Array]:
    """cos, sin [B,T,rot] for integer positions pos [B,T]: inv_freq[j] = θ^(−2j/rot), emb = [freqs, freqs].

    Text-only interleaved mRoPE has equal t/h/w rows, so it is this plain partial RoPE (§3.3). Computed in fp32,
    cast to the activation dtype as HF does.
    """
    rot = cfg.rotary_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, rot, 2, dtype=F32) / rot))
    freqs = pos.astype(F32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def segment_starts(segments: jax.Array) -> jax.Array:
    """[B,T] bool: True where a packed row's segment starts (t = 0, or an id that differs from the one before)."""
    return jnp.concatenate([jnp.ones_like(segments[:, :1], bool), segments[:, 1:] != segments[:, :-1]], axis=1)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """NeoX split-half RoPE on the first rot dims of x [B,T,N,H]: x_rot·cos + rotate_half(x_rot)·sin."""
    rot = cos.shape[-1]
    xr, xp = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = jnp.concatenate([-xr[..., half:], xr[..., :half]], axis=-1)
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    return jnp.concatenate([xr * c + rotated * s, xp], axis=-1)


def attention_qkv(p, x: jax.Array, pos: jax.Array, cfg: ModelConfig):
    """Projections of gated attention: q, k (normed, RoPE'd) [B,T,·,H], v [B,T,K,H] and the output gate [B,T,N,H].

    HF's q_proj rows are per head [q_h | gate_h]; params keep them as separate wq / wgate.
    """
    q = jnp.einsum("BTD,DNH->BTNH", x, p.wq)
    gate = jnp.einsum("BTD,DNH->BTNH", x, p.wgate)
    k = jnp.einsum("BTD,DKH->BTKH", x, p.wk)
    v = jnp.einsum("BTD,DKH->BTKH", x, p.wv)
    q = rms_norm(q, p.q_norm, cfg.rms_norm_eps)
    k = rms_norm(k, p.k_norm, cfg.rms_norm_eps)
    cos, sin = rope_cos_sin(pos, cfg, x.dtype)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, gate


def attend(q: jax.Array, k: jax.Array, v: jax.Array, q_pos: jax.Array, k_pos: jax.Array,
           q_seg: jax.Array | None = None, k_seg: jax.Array | None = None) -> jax.Array:
    """Causal GQA softmax attention: q [B,T,N,H], k/v [B,S,K,H]; key s is visible to query t iff k_pos ≤ q_pos
    (and, for packed rows, iff k_seg = q_seg: segment ids q_seg [B,T], k_seg [B,S]).

    q_pos [B,T], k_pos [B,S] (a key slot that must never be seen gets k_pos = +large). Query head n uses kv head
    n // (N/K) (HF repeat_kv). Scores and softmax in fp32, scale H^-0.5. The G = N/K query heads of a kv head are
    laid out as one [G·T, H] matrix per (batch, kv head) so both products are plain batched matmuls (on XLA CPU
    ~5× faster than contracting the [B,T,K,G,H] layout directly).
    """
    b, t, n, h = q.shape
    kv = k.shape[2]
    g = n // kv
    qg = jnp.transpose(q.reshape(b, t, kv, g, h), (0, 2, 3, 1, 4)).reshape(b, kv, g * t, h)
    kt, vt = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
    scores = jnp.einsum("BKQH,BKSH->BKQS", qg, kt, preferred_element_type=F32) * (h ** -0.5)
    mask = k_pos[:, None, None, :] <= jnp.tile(q_pos, (1, g))[:, None, :, None]
    if q_seg is not None:
        mask = mask & (k_seg[:, None, None, :] == jnp.tile(q_seg, (1, g))[:, None, :, None])
    scores = jnp.where(mask, scores, jnp.finfo(F32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("BKQS,BKSH->BKQH", probs, vt, preferred_element_type=F32).astype(v.dtype)
    return jnp.transpose(out.reshape(b, kv, g, t, h), (0, 3, 1, 2, 4)).reshape(b, t, n, h)


def causal_self_attend(q: jax.Array, k: jax.Array, v: jax.Array, pos: jax.Array, block: int = 128,
                       seg: jax.Array | None = None) -> jax.Array:
    """`attend(q, k, v, pos, pos, seg, seg)` for a sequence attending to itself with positions increasing along T
    (within each segment of a packed row: seg [B,T] segment ids, pos restarting at 0 in each).

    Queries go in blocks of `block`; block [i, i+b) attends to keys [0, i+b) only, since later keys have larger
    positions and are masked anyway. That skips about half the score matrix (forward+backward of the small
    preset's 4×512 attention on CPU: 35.5 ms against 79.5 ms for one [T, T] block, measured in one process).
    In a packed row the later keys are later in their own segment (masked by position) or in a later segment
    (masked by segment), so the skip holds there too.
    """
    t = q.shape[1]
    sq = (lambda i: None) if seg is None else (lambda i: seg[:, i:i + block])  # noqa: E731
    sk = (lambda i: None) if seg is None else (lambda i: seg[:, :i + block])  # noqa: E731
    outs = [attend(q[:, i:i + block], k[:, :i + block], v[:, :i + block], pos[:, i:i + block], pos[:, :i + block],
                   sq(i), sk(i)) for i in range(0, t, block)]
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


def attention_out(p, attn: jax.Array, gate: jax.Array) -> jax.Array:
    """o = attn ⊙ σ(gate), then o_proj: [B,T,N,H] -> [B,T,D]."""
    o = attn * jax.nn.sigmoid(gate.astype(F32)).astype(attn.dtype)
    return jnp.einsum("BTNH,NHD->BTD", o, p.wo)


def gated_attention(p, x: jax.Array, pos: jax.Array, cfg: ModelConfig, seg: jax.Array | None = None) -> jax.Array:
    """Gated full attention over the sequence itself (no cache): x [B,T,D], pos [B,T] increasing along T (along
    each segment of a packed row, seg [B,T]) -> [B,T,D]."""
    q, k, v, gate = attention_qkv(p, x, pos, cfg)
    return attention_out(p, causal_self_attend(q, k, v, pos, seg=seg), gate)


def gated_attention_cached(p, x, pos, valid, k_cache, v_cache, cfg: ModelConfig):
    """Gated attention that first writes this chunk's k/v into a per-row cache, then attends over the cache.

    x [B,T,D]; pos [B,T] absolute positions (= cache length + t); valid [B,T] (only valid tokens are written);
    k_cache/v_cache [B,S,K,H]. Cache slot s holds position s; slots at or beyond a query's position are masked
    by causality, so stale slots past a row's length are never read. Returns (out [B,T,D], k_cache, v_cache).
    """
    q, k, v, gate = attention_qkv(p, x, pos, cfg)
    s = k_cache.shape[1]
    slot = jnp.where(valid, pos, s)  # out-of-range slots are dropped
    rows = jnp.arange(x.shape[0])[:, None]
    k_cache = k_cache.at[rows, slot].set(k.astype(k_cache.dtype), mode="drop")
    v_cache = v_cache.at[rows, slot].set(v.astype(v_cache.dtype), mode="drop")
    k_pos = jnp.broadcast_to(jnp.arange(s, dtype=pos.dtype), (x.shape[0], s))
    attn = attend(q, k_cache.astype(q.dtype), v_cache.astype(q.dtype), pos, k_pos)
    return attention_out(p, attn, gate), k_cache, v_cache
