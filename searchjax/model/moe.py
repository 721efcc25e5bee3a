"""Sparse MoE block of Qwen3.5 (QWEN35.md §3.5) and the router load-balancing statistics.

    p = softmax(x W_r) (fp32);  (w, e) = top-k(p);  w ← w / Σw  (always renormalised)
    y = Σ_j w_j · Expert_{e_j}(x) + σ(x·w_sg) · SharedExpert(x),   Expert(x) = (silu(x W_g) ⊙ x W_u) W_d

The routed experts go through `moe_dispatch.expert_ffn` (sorted, grouped matmuls: compute grows with k, not E).
Routing replay (`route(..., replay=)`): e comes from a recording (the inference engine's), w from this router's
own p at those experts, renormalised; the training forward then routes as the sampler did.

Load-balancing loss (Switch Transformer eq. 4–6, as HF `load_balancing_loss_func` over all layers at once):
    L_aux = E · Σ_e f_e · P_e,   f_e = (#top-k assignments to e) / R,   P_e = (Σ p_e over rows) / R,
with R the number of (valid token, layer) rows. `RouterStats` carries the sums so layers can be accumulated.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from searchjax.model.config import ModelConfig
from searchjax.model.moe_dispatch import expert_ffn, resolve_impl

F32 = jnp.float32


@struct.dataclass
class RouterStats:
    """Sums over routed rows: counts[e] (top-k assignments), probs[e] (router probabilities), rows (token rows)."""

    counts: jax.Array
    probs: jax.Array
    rows: jax.Array

    @classmethod
    def zeros(cls, num_experts: int) -> "RouterStats":
        return cls(jnp.zeros((num_experts,), F32), jnp.zeros((num_experts,), F32), jnp.zeros((), F32))

    def __add__(self, other: "RouterStats") -> "RouterStats":
        return RouterStats(self.counts + other.counts, self.probs + other.probs, self.rows + other.rows)

    def aux_loss(self) -> jax.Array:
        """L_aux = E · Σ_e (counts_e / R) · (probs_e / R)."""
        rows = jnp.maximum(self.rows, 1.0)
        return self.counts.shape[0] * jnp.sum((self.counts / rows) * (self.probs / rows))


def route(router: jax.Array, xs: jax.Array, k: int, replay: jax.Array | None = None):
    """Router: probs = softmax(xs W_r) in fp32; top-k, renormalised, cast to xs.dtype. Returns (w, idx, own, probs).

    replay [N, k] int (routing replay): the experts to use instead of the top-k where replay[n, 0] >= 0 (a row
    of −1 keeps the router's own choice); their weights are the router's own probabilities of those experts,
    renormalised, so the router still gets its gradient. `own` is the router's own top-k either way.
    """
    logits = jnp.einsum("ND,DE->NE", xs, router)
    probs = jax.nn.softmax(logits.astype(F32), axis=-1)
    own = jax.lax.top_k(probs, k)[1].astype(jnp.int32)
    idx = own if replay is None else jnp.where(replay[:, :1] >= 0, replay.astype(jnp.int32), own)
    top_w = jnp.take_along_axis(probs, idx, axis=-1)
    top_w = top_w / jnp.sum(top_w, axis=-1, keepdims=True)
    return top_w.astype(xs.dtype), idx, own, probs


def swiglu(xs: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """(silu(xs W_g) ⊙ xs W_u) W_d for a dense FFN (the shared expert)."""
    h = jnp.einsum("ND,DF->NF", xs, w_gate, preferred_element_type=F32)
    u = jnp.einsum("ND,DF->NF", xs, w_up, preferred_element_type=F32)
    return jnp.einsum("NF,FD->ND", (jax.nn.silu(h) * u).astype(xs.dtype), w_down)


def moe_block(p, x: jax.Array, valid: jax.Array, cfg: ModelConfig, experts=None,
              replay: jax.Array | None = None) -> tuple[jax.Array, RouterStats, jax.Array, jax.Array]:
    """Sparse MoE on x [B,T,D]; `valid` [B,T] masks rows out of the router statistics only.

    experts = (w_gate, w_up, w_down, layer) with per-layer stacks [L, E, ...] replaces p.w_gate/w_up/w_down by
    the stacks' layer `layer`, read in place (`expert_ffn(..., layer=)`; used by prefill and decode).
    replay [B,T,k]: routing replay (`route`). Returns (y, stats, used [B,T,k] i32, own [B,T,k] i32): the experts
    each token went to, and the router's own top-k (equal without replay).
    """
    b, t, d = x.shape
    k = cfg.num_experts_per_tok
    xs = x.reshape(b * t, d)
    top_w, top_idx, own, probs = route(p.router, xs, k, None if replay is None else replay.reshape(b * t, k))
    impl = resolve_impl(cfg.moe_impl)
    if experts is None:
        routed = expert_ffn(xs, top_idx, top_w, p.w_gate, p.w_up, p.w_down, impl=impl)
    else:
        routed = expert_ffn(xs, top_idx, top_w, *experts[:3], impl=impl, layer=experts[3])
    shared = swiglu(xs, p.shared_gate, p.shared_up, p.shared_down)
    gate = jax.nn.sigmoid(jnp.einsum("ND,D->N", xs, p.shared_expert_gate).astype(F32))[:, None]
    y = routed.astype(F32) + gate * shared.astype(F32)
    m = valid.reshape(b * t).astype(F32)
    counts = jnp.zeros((cfg.num_experts,), F32).at[top_idx].add(jnp.broadcast_to(m[:, None], top_idx.shape))
    stats = RouterStats(counts, jnp.sum(probs * m[:, None], axis=0), jnp.sum(m))
    return y.astype(x.dtype).reshape(b, t, d), stats, top_idx.reshape(b, t, k), own.reshape(b, t, k)
