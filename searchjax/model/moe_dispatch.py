"""Dropless, sparse dispatch of tokens to routed experts (the grouped SwiGLU FFN of a MoE layer).

For tokens x[N, D] routed to X experts each (indices top_idx[N, X], weights top_w[N, X]):

    y[n] = Σ_j top_w[n, j] · ( silu(x[n] W_g[e]) ⊙ (x[n] W_u[e]) ) W_d[e],     e = top_idx[n, j]

(QWEN35.md §3.5). Nothing is dropped (no capacity factor), so inference matches Hugging Face exactly.
Compute grows with N·X, not with E: the N·X (token, expert) assignments are sorted by expert, so each expert's
rows are contiguous, and a *grouped* matmul multiplies each group by its own expert's weights:

* ``"ragged"``: ``jax.lax.ragged_dot`` (native grouped GEMM on GPU/TPU; on CPU XLA lowers it densely over E).
* ``"block"``: block-sparse, for CPU. Each expert's group is padded to a multiple of a block size b; the
  number of blocks ⌊(N·X + min(E, N·X)·(b−1)) / b⌋ is static and every block belongs to one expert. One
  `lax.scan` step per block multiplies its [b, D] rows by that expert's [D, F] weights (indexed, not copied);
  a custom VJP makes the backward pass one scan too, adding each block's weight gradient into its expert's
  slice only, so forward and backward cost O(N·X·D·F), independent of E.

Both are plain gathers and matmuls, hence differentiable (training) and jit-able; matmuls accumulate in fp32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

IMPLS = ("ragged", "block")


def default_impl() -> str:
    """The grouped-matmul scheme that is fastest on the default backend."""
    return "block" if jax.default_backend() == "cpu" else "ragged"


def resolve_impl(name: str) -> str:
    """A config's `moe_impl` ("auto", "block" or "ragged") as the scheme to use: "auto" = `default_impl()`."""
    return default_impl() if name == "auto" else name


def default_block_size(num_rows: int, num_experts: int) -> int:
    """Block size b for the block scheme: a power of two near a quarter of the mean group N·X/E, in [1, 256].

    Padding wastes about E·b/2 rows, i.e. ~1/8 of N·X at b = N·X/(4E), while large blocks keep each matmul
    efficient when groups are big (measured on CPU: 2048 tokens top-4 of 64 experts, b = 32 is fastest; of 8
    experts, b = 256).
    """
    quarter = max(1, num_rows // (4 * max(1, num_experts)))
    return int(min(256, 1 << (quarter.bit_length() - 1)))


def _check(x, top_idx, top_w, w_gate, w_up, w_down, stacked: bool) -> None:
    n, d = x.shape
    if stacked:
        if w_gate.ndim != 4 or w_up.shape[:1] != w_gate.shape[:1] or w_down.shape[:1] != w_gate.shape[:1]:
            raise ValueError(f"expert_ffn: with `layer`, weights must be stacked [L, E, ...], got {w_gate.shape}, "
                             f"{w_up.shape}, {w_down.shape}")
        w_gate, w_up, w_down = w_gate[0], w_up[0], w_down[0]
    e, d2, f = w_gate.shape
    if top_idx.ndim != 2 or top_idx.shape[0] != n:
        raise ValueError(f"expert_ffn: top_idx must be [N={n}, X], got shape {top_idx.shape}")
    if top_w.shape != top_idx.shape:
        raise ValueError(f"expert_ffn: top_w shape {top_w.shape} != top_idx shape {top_idx.shape}")
    if not jnp.issubdtype(top_idx.dtype, jnp.integer):
        raise ValueError(f"expert_ffn: top_idx must be integer, got {top_idx.dtype}")
    if d2 != d or w_up.shape != (e, d, f) or w_down.shape != (e, f, d):
        raise ValueError(
            f"expert_ffn: expected w_gate/w_up [E, D={d}, F] and w_down [E, F, D={d}], got "
            f"{w_gate.shape}, {w_up.shape}, {w_down.shape}"
        )


def _sort_by_expert(flat_idx: jax.Array, num_experts: int):
    """Sort the N·X assignments (flat_idx[n·X + j] = top_idx[n, j]) by expert.

    Returns (order, inverse, group_sizes): `order[i]` is the flat assignment (n·X + j) at sorted position i,
    `inverse` its inverse permutation, and `group_sizes[e]` the number of rows routed to expert e.
    """
    order = jnp.argsort(flat_idx, stable=True)
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
    group_sizes = jnp.bincount(flat_idx, length=num_experts).astype(jnp.int32)
    return order, inverse, group_sizes


def _swiglu(h: jax.Array, u: jax.Array, dtype) -> jax.Array:
    """silu(h) ⊙ u in fp32, cast back to the activation dtype for the down projection."""
    return (jax.nn.silu(h) * u).astype(dtype)


def _ragged_ffn(x, flat_idx, w_gate, w_up, w_down, num_x: int) -> jax.Array:
    """Grouped SwiGLU with `jax.lax.ragged_dot` over expert-sorted rows; returns fp32 [N·X, D] rows."""
    order, inverse, group_sizes = _sort_by_expert(flat_idx, w_gate.shape[0])
    xs = x[order // num_x]
    h = jax.lax.ragged_dot(xs, w_gate, group_sizes, preferred_element_type=jnp.float32)
    u = jax.lax.ragged_dot(xs, w_up, group_sizes, preferred_element_type=jnp.float32)
    a = _swiglu(h, u, x.dtype)
    return jax.lax.ragged_dot(a, w_down, group_sizes, preferred_element_type=jnp.float32)[inverse]


def _block_layout(flat_idx: jax.Array, num_experts: int, num_x: int, block: int):
    """Place the N·X expert-sorted assignments into expert-pure blocks of b rows.

    Expert e's c_e rows (sorted position o_e = Σ_{e'<e} c_e' onwards) go to padded rows starting at
    p_e = Σ_{e'<e} b·⌈c_e'/b⌉, so every block of b padded rows belongs to one expert. Since
    Σ_e ⌈c_e/b⌉ ≤ (N·X + min(E, N·X)·(b−1)) / b, that many blocks always suffice (a static count).
    Returns (block_expert[nb], token[nb·b], valid[nb·b], pos[N·X]): the expert of each block, the token
    feeding each padded row (valid=False for padding), and the padded row of each assignment n·X + j.
    """
    m = flat_idx.shape[0]
    order, inverse, group_sizes = _sort_by_expert(flat_idx, num_experts)
    nb = (m + min(num_experts, m) * (block - 1)) // block
    padded = (group_sizes + block - 1) // block * block
    pad_end = jnp.cumsum(padded)
    pad_start = pad_end - padded
    row_start = jnp.cumsum(group_sizes) - group_sizes
    block_expert = jnp.searchsorted(pad_end, jnp.arange(nb, dtype=jnp.int32) * block, side="right")
    block_expert = jnp.minimum(block_expert, num_experts - 1).astype(jnp.int32)
    row_expert = jnp.repeat(block_expert, block, total_repeat_length=nb * block)
    local = jnp.arange(nb * block, dtype=jnp.int32) - pad_start[row_expert]
    valid = (local >= 0) & (local < group_sizes[row_expert])
    token = order[jnp.clip(row_start[row_expert] + local, 0, m - 1)] // num_x
    pos = pad_start[flat_idx] + inverse - row_start[flat_idx]
    return block_expert, token, valid, pos


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _dot_t(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ bᵀ in fp32."""
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _blocks_fwd(xp, block_expert, w_gate, w_up, w_down):
    """y_b = (silu(x_b W_g[e_b]) ⊙ x_b W_u[e_b]) W_d[e_b] for each block b, one loop step per block."""

    def step(_, args):
        xb, e = args
        h, u = _dot(xb, w_gate[e]), _dot(xb, w_up[e])
        return None, (_dot(_swiglu(h, u, xb.dtype), w_down[e]), h, u)

    _, (yp, h, u) = jax.lax.scan(step, None, (xp, block_expert))
    return yp, (xp, block_expert, h, u, w_gate, w_up, w_down)


def _blocks_bwd(res, dyp):
    """Per block: da = dy W_dᵀ; dh = da ⊙ u ⊙ silu'(h); du = da ⊙ silu(h); dx = dh W_gᵀ + du W_uᵀ.

    Weight gradients accumulate into expert e_b's slice only (dW_g[e] += x_bᵀ dh, ...), so the backward pass
    costs O(blocks · D · F) like the forward, independent of E.
    """
    xp, block_expert, h_all, u_all, w_gate, w_up, w_down = res

    def step(grads, args):
        xb, e, h, u, dy = args
        sig = jax.nn.sigmoid(h)
        silu = h * sig
        da = _dot_t(dy.astype(w_down.dtype), w_down[e])
        dh = (da * u * sig * (1.0 + h * (1.0 - sig))).astype(xb.dtype)
        du = (da * silu).astype(xb.dtype)
        dx = _dot_t(dh, w_gate[e]) + _dot_t(du, w_up[e])
        a = (silu * u).astype(xb.dtype)
        dg, du_w, dd = grads
        dg = dg.at[e].add(_dot(xb.T, dh))
        du_w = du_w.at[e].add(_dot(xb.T, du))
        dd = dd.at[e].add(_dot(a.T, dy.astype(xb.dtype)))
        return (dg, du_w, dd), dx.astype(xb.dtype)

    zeros = tuple(jnp.zeros(w.shape, jnp.float32) for w in (w_gate, w_up, w_down))
    (dg, du, dd), dxp = jax.lax.scan(step, zeros, (xp, block_expert, h_all, u_all, dyp))
    return dxp, None, dg.astype(w_gate.dtype), du.astype(w_up.dtype), dd.astype(w_down.dtype)


@jax.custom_vjp
def _blocks_swiglu(xp, block_expert, w_gate, w_up, w_down):
    """SwiGLU of expert-pure blocks xp[nb, b, D] with expert block_expert[nb]; fp32 [nb, b, D]."""
    return _blocks_fwd(xp, block_expert, w_gate, w_up, w_down)[0]


_blocks_swiglu.defvjp(_blocks_fwd, _blocks_bwd)


def _block_ffn(x, flat_idx, w_gate, w_up, w_down, num_x: int, block: int, layer=None) -> jax.Array:
    """Grouped SwiGLU over expert-pure blocks of b rows; returns fp32 [N·X, D] rows.

    With `layer`, the weights are stacks [L, E, ...] viewed as [L·E, ...] (a free reshape) and block b uses
    expert layer·E + e_b: each step reads only its expert's slice, the layer's [E, ...] weights are never copied
    out of the stack. That path has no custom VJP (plain autodiff; meant for inference).
    """
    num_experts = w_gate.shape[-3]
    block_expert, token, valid, pos = _block_layout(flat_idx, num_experts, num_x, block)
    nb = block_expert.shape[0]
    xp = jnp.where(valid[:, None], x[token], jnp.zeros((), x.dtype)).reshape(nb, block, x.shape[1])
    if layer is None:
        yp = _blocks_swiglu(xp, block_expert, w_gate, w_up, w_down)
    else:
        merged = [w.reshape(-1, *w.shape[2:]) for w in (w_gate, w_up, w_down)]
        yp = _blocks_fwd(xp, block_expert + layer * num_experts, *merged)[0]
    return yp.reshape(nb * block, -1)[pos]


def expert_ffn(
    x: jax.Array,
    top_idx: jax.Array,
    top_w: jax.Array,
    w_gate: jax.Array,
    w_up: jax.Array,
    w_down: jax.Array,
    *,
    impl: str | None = None,
    block_size: int | None = None,
    layer: jax.Array | int | None = None,
) -> jax.Array:
    """Σ_j top_w[n,j] · SwiGLU_e(x[n]) with e = top_idx[n,j], dropless and sparse (see module docstring).

    Args:
      x: [N, D] tokens. top_idx: [N, X] int expert ids in [0, E). top_w: [N, X] routing weights.
      w_gate, w_up: [E, D, F]. w_down: [E, F, D].
      impl: "ragged" or "block"; None picks per backend (`default_impl`).
      block_size: block size b for "block" (None: `default_block_size`).
      layer: if given, w_gate/w_up/w_down are per-layer stacks [L, E, ...] and layer (a traced or static
        index) selects one, without copying the layer's weights out of the stack (see `_block_ffn`).
    Returns:
      [N, D] in x.dtype (matmuls and the weighted sum accumulate in fp32).
    """
    x, top_idx, top_w, w_gate, w_up, w_down = map(jnp.asarray, (x, top_idx, top_w, w_gate, w_up, w_down))
    _check(x, top_idx, top_w, w_gate, w_up, w_down, layer is not None)
    impl = impl or default_impl()
    if impl not in IMPLS:
        raise ValueError(f"expert_ffn: impl must be one of {IMPLS}, got {impl!r}")
    n, d = x.shape
    num_x = top_idx.shape[1]
    flat_idx = top_idx.reshape(-1).astype(jnp.int32)
    if impl == "ragged":
        if layer is not None:
            w_gate, w_up, w_down = (jax.lax.dynamic_index_in_dim(w, layer, keepdims=False)
                                    for w in (w_gate, w_up, w_down))
        ys = _ragged_ffn(x, flat_idx, w_gate, w_up, w_down, num_x)
    else:
        block = block_size or default_block_size(n * num_x, w_gate.shape[-3])
        if block < 1:
            raise ValueError(f"expert_ffn: block_size must be >= 1, got {block_size}")
        ys = _block_ffn(x, flat_idx, w_gate, w_up, w_down, num_x, int(block), layer)
    y = ys.reshape(n, num_x, d)
    return jnp.einsum("NXD,NX->ND", y, top_w.astype(jnp.float32)).astype(x.dtype)
