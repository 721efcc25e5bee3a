"""The Qwen3.5 MoE decoder (QWEN35.md §3.1): full forward, cached prefill (all or last logits), single-token decode.

    h = embed[tokens];  for each layer i:  h += Mixer_i(RMSNorm(h));  h += MoE_i(RMSNorm(h))
    logits = RMSNorm(h; final_norm) @ unembedᵀ            (Mixer = Gated DeltaNet or gated attention)

Layers run as one `lax.scan` over the layer list (`lax.switch` on each layer's type, its weights dynamically indexed
from the per-type stacks) or as a Python loop (`cfg.layer_loop`); the three entry points differ only in the
per-layer mixer functions they hand to `_run_layers`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from searchjax.model.cache import Cache
from searchjax.model.config import FULL, LINEAR, ModelConfig
from searchjax.model.deltanet import deltanet, deltanet_step
from searchjax.model.layers import gated_attention, gated_attention_cached, rms_norm, segment_starts
from searchjax.model.moe import RouterStats, moe_block
from searchjax.model.moe_dispatch import resolve_impl
from searchjax.model.params import Params

F32 = jnp.float32
UNROLL_MAX_LAYERS = 16  # layer_loop="auto" unrolls up to this depth (compile time grows with the depth)


def unrolled(cfg: ModelConfig) -> bool:
    """Whether the layers run as a Python loop (cfg.layer_loop "unroll", or "auto" with ≤ UNROLL_MAX_LAYERS)."""
    return cfg.layer_loop == "unroll" or (cfg.layer_loop == "auto" and cfg.num_hidden_layers <= UNROLL_MAX_LAYERS)


def _at(tree, j):
    return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, j, keepdims=False), tree)


def _put(tree, value, j):
    return jax.tree.map(lambda a, v: jax.lax.dynamic_update_index_in_dim(a, v.astype(a.dtype), j, 0), tree, value)


def _run_layers(params: Params, x, valid, cfg: ModelConfig, mixers, caches, remat: bool = False,
                in_place_experts: bool = False, replay=None):
    """Run all decoder layers. mixers[type](layer_params, x_normed, layer_cache) -> (out, new_layer_cache).

    caches = (linear_caches, full_caches), pytrees stacked on a leading layer axis (None without a cache).
    One `lax.scan` step per layer, `lax.switch` on its type; the step indexes that type's stacks with the layer's
    rank among its type. (One layer per step: XLA CPU runs several MoE blocks in one loop body ~3× slower.)
    in_place_experts=True (inference) reads the routed experts' weights straight from the stacks instead of
    slicing the layer's [E, D, F] stacks out (a copy per layer on XLA CPU); see `moe_block`.
    With `unrolled(cfg)` (by default: at most UNROLL_MAX_LAYERS layers) the layers run as a Python loop with static
    layer indices instead of the scan. On CPU that is faster both ways: in decode the scan's `lax.switch` copied the
    whole stacked caches every step (small preset: 14 ms), and the small preset's 4×512 forward+backward took
    2.98 s with the scan, 2.18 s unrolled (BENCHMARKS.md). remat=True rematerialises each layer in both forms.
    replay [L,B,T,k] (routing replay, `moe.route`): the experts each token of each layer goes to (−1: its own).
    Returns (x, RouterStats summed over layers, new caches, (used, own)): used and own [L,B,T,k] i32 are the
    experts each token went to and the router's own top-k (XLA drops them where the caller does not use them).
    """
    kinds = [k for k in (LINEAR, FULL) if k in cfg.layer_types]
    stacks = {LINEAR: (params.linear, 0), FULL: (params.full, 1)}
    ranks = [cfg.layer_types[:i].count(t) for i, t in enumerate(cfg.layer_types)]  # index within the type's stack

    def run(kind):
        def layer(x, stats, caches, j, rp):
            stack, slot = stacks[kind]
            p, c = _at(stack, j), (None if caches[slot] is None else _at(caches[slot], j))
            out, c = mixers[kind](p, rms_norm(x, p.input_norm, cfg.rms_norm_eps), c)
            x = x + out
            experts = (stack.moe.w_gate, stack.moe.w_up, stack.moe.w_down, j) if in_place_experts else None
            y, st, used, own = moe_block(p.moe, rms_norm(x, p.post_norm, cfg.rms_norm_eps), valid, cfg, experts, rp)
            if c is not None:
                caches = tuple(_put(cs, c, j) if i == slot else cs for i, cs in enumerate(caches))
            return (x + y, stats + st, caches), (used, own)
        return layer

    carry = (x, RouterStats.zeros(cfg.num_experts), caches)
    if unrolled(cfg):
        routes = []
        for i, (kind, j) in enumerate(zip(cfg.layer_types, ranks)):  # static indices: no switch, in-place caches
            layer = jax.checkpoint(run(kind), static_argnums=(3,)) if remat else run(kind)
            carry, r = layer(*carry, j, None if replay is None else replay[i])
            routes.append(r)
        return (*carry, tuple(jnp.stack(r) for r in zip(*routes)))

    def body(carry, xs):
        kind, j, rp = xs
        return jax.lax.switch(kind, [run(k) for k in kinds], *carry, j, rp)

    body = jax.checkpoint(body) if remat else body
    branch = jnp.array([kinds.index(t) for t in cfg.layer_types], jnp.int32)
    (x, stats, caches), routes = jax.lax.scan(body, carry, (branch, jnp.array(ranks, jnp.int32), replay))
    return x, stats, caches, routes


def _embed(params: Params, tokens: jax.Array) -> jax.Array:
    return jnp.take(params.embed, tokens, axis=0)


def unembed(params: Params, h: jax.Array) -> jax.Array:
    """logits = h @ params.unembedᵀ in fp32: [..., D] -> [..., V]."""
    return jnp.einsum("...D,VD->...V", h, params.unembed, preferred_element_type=F32)


def _zero_linear_state(cfg: ModelConfig, b: int, dtype):
    kc, nk, nv = cfg.linear_conv_kernel_dim, cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    conv = (jnp.zeros((b, kc, nk, dk), dtype), jnp.zeros((b, kc, nk, dk), dtype), jnp.zeros((b, kc, nv, dv), dtype))
    return conv, jnp.zeros((b, nv, dk, dv), F32)


def segment_positions(segments: jax.Array) -> jax.Array:
    """Position of each token inside its segment: t − (start of the run of equal ids holding t), [B,T] int32."""
    t = jnp.arange(segments.shape[1], dtype=jnp.int32)
    return t - jax.lax.cummax(jnp.where(segment_starts(segments), t, 0), axis=1)


@functools.partial(jax.jit, static_argnames=("cfg", "remat", "return_aux"))
def hidden_states(params: Params, tokens: jax.Array, cfg: ModelConfig, *, remat: bool = False,
                  return_aux: bool = False, valid: jax.Array | None = None, routes: jax.Array | None = None,
                  segments: jax.Array | None = None):
    """Final-normed hidden states [B,T,D] of tokens [B,T] (no cache).

    valid [B,T] bool marks the real tokens of a right-padded batch (default: every token). It keeps padding out
    of the router statistics, so L_aux counts R = Σ valid rows per layer (moe.py); the hidden states of real
    tokens do not depend on it (causality already hides the padding after them), those of padding are
    meaningless. With return_aux=True returns (h, aux) where aux["router_aux_loss"] is the load-balancing loss
    L_aux (multiply by cfg.router_aux_loss_coef in a training loss). remat=True rematerialises each layer cycle
    in the backward pass. Logits are `unembed(params, h)` (params.unembed is the [V,D] matrix).
    routes [B,T,L,k] int (routing replay, `moe.route`): the experts token t of layer l goes to, as the inference
    engine recorded them (`prefill(..., return_routes=True)`, `decode_step`); −1 rows keep the router's own
    choice. aux["routes_own"] [B,T,L,k] i32 is the router's own top-k (to count where it differs from `routes`).
    segments [B,T] int (packed rows): consecutive runs of one id are separate sequences; each starts at position
    0 and sees only itself (attention masked by segment, DeltaNet conv and state restarted), so a token's hidden
    state is the one it has in its sequence alone. Padding is a segment of its own (any id, e.g. 0).
    """
    b, t = tokens.shape
    x = _embed(params, tokens)
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if segments is not None:
        segments = jnp.asarray(segments, jnp.int32)
        pos = segment_positions(segments)
    every = jnp.ones((b, t), bool)
    conv0, state0 = _zero_linear_state(cfg, b, x.dtype)
    mixers = {
        LINEAR: lambda p, xn, c: (deltanet(p, xn, every, conv0, state0, cfg, segments)[0], None),
        FULL: lambda p, xn, c: (gated_attention(p, xn, pos, cfg, segments), None),
    }
    routed = every if valid is None else jnp.asarray(valid, bool)
    replay = None if routes is None else jnp.moveaxis(jnp.asarray(routes, jnp.int32), 2, 0)
    x, stats, _, (_, own) = _run_layers(params, x, routed, cfg, mixers, (None, None), remat, replay=replay)
    h = rms_norm(x, params.final_norm, cfg.rms_norm_eps)
    aux = {"router_aux_loss": stats.aux_loss(), "routes_own": jnp.moveaxis(own, 0, 2)}
    return (h, aux) if return_aux else h


@functools.partial(jax.jit, static_argnames=("cfg", "remat", "return_aux"))
def forward(params: Params, tokens: jax.Array, cfg: ModelConfig, *, remat: bool = False, return_aux: bool = False,
            valid: jax.Array | None = None, routes: jax.Array | None = None, segments: jax.Array | None = None):
    """Logits float32 [B,T,V] of int32 tokens [B,T] (§3.1); with return_aux=True, (logits, aux); `valid`,
    `routes` (routing replay) and `segments` (packed rows) as in hidden_states."""
    out = hidden_states(params, tokens, cfg, remat=remat, return_aux=return_aux, valid=valid, routes=routes,
                        segments=segments)
    h, aux = out if return_aux else (out, None)
    logits = unembed(params, h)
    return (logits, aux) if return_aux else logits


def _run_cached(params: Params, tokens, cfg: ModelConfig, cache: Cache, pos, valid, deltanet_fn):
    """Layers over tokens [B,T] at positions pos [B,T] with the cache; deltanet_fn(p, x, conv, state) runs a
    DeltaNet layer (chunked for prefill, recurrent for decode). Returns (final-normed h, new cache w/o lengths,
    the experts every token went to [B,T,L,k] i32)."""

    def lin(p, xn, c):
        out, conv, state = deltanet_fn(p, xn, c[:3], c[3])
        return out, (*conv, state)

    def full(p, xn, c):
        out, k, v = gated_attention_cached(p, xn, pos, valid, c[0], c[1], cfg)
        return out, (k, v)

    caches = ((cache.conv_q, cache.conv_k, cache.conv_v, cache.state), (cache.k, cache.v))
    # Reading routed experts in place from the [L, E, ...] stacks pays off for the CPU block dispatch only; with
    # ragged_dot (GPU/TPU) the per-layer slice is cheap, and the in-place view of expert-sharded stacks tripled
    # the per-chip memory of the sharded 397B (BENCHMARKS.md, AOT section).
    in_place = resolve_impl(cfg.moe_impl) == "block"
    x, _, (lin_c, (k, v)), (used, _) = _run_layers(params, _embed(params, tokens), valid, cfg,
                                                   {LINEAR: lin, FULL: full}, caches, in_place_experts=in_place)
    conv_q, conv_k, conv_v, state = lin_c
    new = Cache(lengths=cache.lengths, k=k, v=v, conv_q=conv_q, conv_k=conv_k, conv_v=conv_v, state=state)
    return rms_norm(x, params.final_norm, cfg.rms_norm_eps), new, jnp.moveaxis(used, 0, 2)


def _prefill_hidden(params: Params, tokens: jax.Array, cfg: ModelConfig, cache: Cache, lengths: jax.Array):
    """(final-normed h [B,T,D], cache, routes [B,T,L,k]) of appending right-padded tokens [B,T] to each row."""
    t = tokens.shape[1]
    lengths = lengths.astype(jnp.int32)
    pos = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
    valid = jnp.arange(t)[None] < lengths[:, None]
    h, new, routes = _run_cached(params, tokens, cfg, cache, pos, valid,
                                 lambda p, x, conv, state: deltanet(p, x, valid, conv, state, cfg))
    return h, new.replace(lengths=cache.lengths + lengths), routes


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def prefill(params: Params, tokens: jax.Array, cfg: ModelConfig, cache: Cache, lengths: jax.Array):
    """Append right-padded tokens [B,T] (lengths[b] valid) to each row of `cache` at position cache.lengths[b].

    Works on an empty cache (prompt prefill) and on a filled one (multi-token continuation). Padded tokens write
    nothing and leave the DeltaNet states unchanged (a row with lengths[b] = 0 is unchanged). Returns
    (logits float32 [B,T,V], cache); cache is donated.
    """
    h, cache, _ = _prefill_hidden(params, tokens, cfg, cache, lengths)
    return unembed(params, h), cache


@functools.partial(jax.jit, static_argnames=("cfg", "return_routes"), donate_argnames=("cache",))
def prefill_last(params: Params, tokens: jax.Array, cfg: ModelConfig, cache: Cache, lengths: jax.Array,
                 return_routes: bool = False):
    """`prefill` returning only the logits of each row's last appended token, float32 [B,V] (the next-token
    logits a decode starts from; meaningless for a row with lengths[b] = 0). Never builds the [B,T,V] logits.
    return_routes=True adds the experts every appended token went to, [B,T,L,k] i32 (routing replay; the
    entries of padding are meaningless)."""
    h, cache, routes = _prefill_hidden(params, tokens, cfg, cache, lengths)
    last = jnp.maximum(lengths.astype(jnp.int32) - 1, 0)
    logits = unembed(params, jnp.take_along_axis(h, last[:, None, None], axis=1)[:, 0])
    return (logits, cache, routes) if return_routes else (logits, cache)


@functools.partial(jax.jit, static_argnames=("cfg", "return_routes"), donate_argnames=("cache",))
def decode_step(params: Params, tokens: jax.Array, cfg: ModelConfig, cache: Cache, active: jax.Array | None = None,
                return_routes: bool = False):
    """One token per row: tokens [B] at position cache.lengths[b] (recurrent DeltaNet, cached attention).

    Rows with active[b] = False leave the cache unchanged (their logits are computed but meaningless).
    Returns (logits float32 [B,V], cache), plus with return_routes=True the experts each token went to
    [B,L,k] i32 (routing replay); cache is donated.
    """
    active = jnp.ones(tokens.shape, bool) if active is None else active.astype(bool)
    h, new, routes = _run_cached(params, tokens[:, None], cfg, cache, cache.lengths[:, None], active[:, None],
                                 lambda p, x, conv, state: deltanet_step(p, x, active, conv, state, cfg))
    out = (unembed(params, h[:, 0]), new.replace(lengths=cache.lengths + active.astype(jnp.int32)))
    return (*out, routes[:, 0]) if return_routes else out
