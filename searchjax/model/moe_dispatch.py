"""Dropless, sparse dispatch of tokens to routed experts (the grouped SwiGLU FFN of a MoE layer).

For tokens x[N, D] routed to X experts each (indices top_idx[N, X], weights top_w[N, X]):

    y[n] = Σ_j top_w[n, j] · ( silu(x[n] W_g[e]) ⊙ (x[n] W_u[e]) ) W_d[e],     e = top_idx[n, j]

(QWEN35.md §3.5). Nothing is dropped (no capacity factor), so inference matches Hugging Face exactly.
Compute grows with N·X, not with E: the N·X (token, expert) assignments are sorted by expert, so each expert's
rows are contiguous, and a *grouped* matmul multiplies each group by its own expert's weights:

* ``"ragged"``: ``jax.lax.ragged_dot`` (native grouped GEMM on GPU/TPU; on CPU XLA lowers it densely over E).
* ``"block"``: block-sparse, for CPU. Each expert's group is padded to a multiple of a block size b; the
  number of blocks ⌊(N·X + min(E, N·X)·(b−1)) / b⌋ is static, every block belongs to one expert, and one
  batched einsum multiplies each [b, D] block by its expert's gathered [D, F] weights.

Both are plain gathers and matmuls, hence differentiable (training) and jit-able; matmuls accumulate in fp32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

IMPLS = ("ragged", "block")


def default_impl() -> str:
    """The grouped-matmul scheme that is fastest on the default backend."""
    return "block" if jax.default_backend() == "cpu" else "ragged"


def default_block_size(num_rows: int, num_experts: int) -> int:
    """Block size b for the block scheme: about the mean group size N·X/E, a power of two in [1, 64].

    Padding wastes at most min(E, N·X)·(b−1) rows, so b ≈ N·X/E keeps the padded work within ~2× of N·X
    while large blocks keep each matmul efficient when groups are big.
    """
    mean = max(1, num_rows // max(1, num_experts))
    return int(min(64, 1 << (mean.bit_length() - 1)))


def _check(x, top_idx, top_w, w_gate, w_up, w_down) -> None:
    n, d = x.shape
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


def _sort_by_expert(top_idx: jax.Array, num_experts: int):
    """Sort the N·X assignments by expert.

    Returns (order, inverse, group_sizes): `order[i]` is the flat assignment (n·X + j) at sorted position i,
    `inverse` its inverse permutation, and `group_sizes[e]` the number of rows routed to expert e.
    """
    flat = top_idx.reshape(-1).astype(jnp.int32)
    order = jnp.argsort(flat, stable=True)
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
    group_sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    return order, inverse, group_sizes


def _swiglu(h: jax.Array, u: jax.Array, dtype) -> jax.Array:
    """silu(h) ⊙ u in fp32, cast back to the activation dtype for the down projection."""
    return (jax.nn.silu(h) * u).astype(dtype)


def _ragged_ffn(xs, group_sizes, w_gate, w_up, w_down) -> jax.Array:
    """Grouped SwiGLU over expert-sorted rows xs[M, D] with `jax.lax.ragged_dot`; returns fp32 [M, D]."""
    h = jax.lax.ragged_dot(xs, w_gate, group_sizes, preferred_element_type=jnp.float32)
    u = jax.lax.ragged_dot(xs, w_up, group_sizes, preferred_element_type=jnp.float32)
    a = _swiglu(h, u, xs.dtype)
    return jax.lax.ragged_dot(a, w_down, group_sizes, preferred_element_type=jnp.float32)


def _block_layout(group_sizes: jax.Array, num_rows: int, block: int):
    """Map padded rows to sorted rows for the block scheme.

    Expert e's c_e sorted rows start at o_e = Σ_{e'<e} c_e' and are placed at padded offset
    p_e = Σ_{e'<e} b·⌈c_e'/b⌉. Returns (block_expert[nb], src[nb·b], valid[nb·b], dest[M]): the expert of each
    block, the sorted row feeding each padded row (valid=False for padding), and each sorted row's padded row.
    """
    e = group_sizes.shape[0]
    nb = (num_rows + min(e, num_rows) * (block - 1)) // block
    padded = (group_sizes + block - 1) // block * block
    pad_end = jnp.cumsum(padded)
    pad_start = pad_end - padded
    row_start = jnp.cumsum(group_sizes) - group_sizes
    block_expert = jnp.minimum(
        jnp.searchsorted(pad_end, jnp.arange(nb, dtype=jnp.int32) * block, side="right"), e - 1
    ).astype(jnp.int32)
    rows = jnp.arange(nb * block, dtype=jnp.int32)
    row_expert = jnp.repeat(block_expert, block, total_repeat_length=nb * block)
    local = rows - pad_start[row_expert]
    valid = (local >= 0) & (local < group_sizes[row_expert])
    src = jnp.clip(row_start[row_expert] + local, 0, num_rows - 1)
    sorted_rows = jnp.arange(num_rows, dtype=jnp.int32)
    sorted_expert = jnp.repeat(jnp.arange(e, dtype=jnp.int32), group_sizes, total_repeat_length=num_rows)
    dest = pad_start[sorted_expert] + sorted_rows - row_start[sorted_expert]
    return block_expert, src, valid, dest


def _block_ffn(xs, group_sizes, w_gate, w_up, w_down, block: int) -> jax.Array:
    """Grouped SwiGLU over expert-sorted rows xs[M, D], one [b, D] block per matmul; returns fp32 [M, D]."""
    m, d = xs.shape
    block_expert, src, valid, dest = _block_layout(group_sizes, m, block)
    nb = block_expert.shape[0]
    xp = jnp.where(valid[:, None], xs[src], jnp.zeros((), xs.dtype)).reshape(nb, block, d)
    h = jnp.einsum("GbD,GDF->GbF", xp, w_gate[block_expert], preferred_element_type=jnp.float32)
    u = jnp.einsum("GbD,GDF->GbF", xp, w_up[block_expert], preferred_element_type=jnp.float32)
    a = _swiglu(h, u, xs.dtype)
    yp = jnp.einsum("GbF,GFD->GbD", a, w_down[block_expert], preferred_element_type=jnp.float32)
    return yp.reshape(nb * block, d)[dest]


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
) -> jax.Array:
    """Σ_j top_w[n,j] · SwiGLU_e(x[n]) with e = top_idx[n,j], dropless and sparse (see module docstring).

    Args:
      x: [N, D] tokens. top_idx: [N, X] int expert ids in [0, E). top_w: [N, X] routing weights.
      w_gate, w_up: [E, D, F]. w_down: [E, F, D].
      impl: "ragged" or "block"; None picks per backend (`default_impl`).
      block_size: block size b for "block" (None: `default_block_size`).
    Returns:
      [N, D] in x.dtype (matmuls and the weighted sum accumulate in fp32).
    """
    _check(x, top_idx, top_w, w_gate, w_up, w_down)
    impl = impl or default_impl()
    if impl not in IMPLS:
        raise ValueError(f"expert_ffn: impl must be one of {IMPLS}, got {impl!r}")
    n, d = x.shape
    num_x = top_idx.shape[1]
    order, inverse, group_sizes = _sort_by_expert(top_idx, w_gate.shape[0])
    xs = x[order // num_x]
    if impl == "ragged":
        ys = _ragged_ffn(xs, group_sizes, w_gate, w_up, w_down)
    else:
        block = block_size or default_block_size(n * num_x, w_gate.shape[0])
        if block < 1:
            raise ValueError(f"expert_ffn: block_size must be >= 1, got {block_size}")
        ys = _block_ffn(xs, group_sizes, w_gate, w_up, w_down, int(block))
    y = ys[inverse].reshape(n, num_x, d)
    return jnp.einsum("NXD,NX->ND", y, top_w.astype(jnp.float32)).astype(x.dtype)
