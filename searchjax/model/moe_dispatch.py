"""Dropless, sparse dispatch of tokens to routed experts (the grouped SwiGLU FFN of a MoE layer).

For tokens x[N, D] routed to X experts each (indices top_idx[N, X], weights top_w[N, X]):

    y[n] = Σ_j top_w[n, j] · ( silu(x[n] W_g[e]) ⊙ (x[n] W_u[e]) ) W_d[e],     e = top_idx[n, j]

(QWEN35.md §3.5). Nothing is dropped, so inference matches Hugging Face exactly. Compute grows with M = N·X,
not with E: the M (token, expert) assignments are sorted by expert, so each expert's rows are contiguous,
and a *grouped* matmul multiplies each group by its own expert's weights:

* ``"ragged"``: ``jax.lax.ragged_dot`` (native grouped GEMM on GPU/TPU; on CPU XLA lowers it densely over E).
* ``"block"``: for CPU, two parts.
  - Capacity: the first C rows of each expert's group (C static, a multiple of 8 near the mean group M/E,
    `default_capacity`) fill slots [E, C, D] and go through three batched einsums "ECD,EDF->ECF", the
    fastest CPU form. Empty slots are zero rows. Plain autodiff; the dispatch gather x[token] and the
    weighted combine are each other's transposes, so both directions are gathers (`_gather_rows`).
  - Overflow: the rows of rank ≥ C go to expert-pure blocks of b rows, each expert's overflow padded to a
    multiple of b. The static block count (`_num_blocks`) bounds every routing, but a `fori_loop` runs only
    over the blocks actually filled (a dynamic trip count), in the forward and in the custom-VJP backward:
    each step multiplies its [b, D] rows by its expert's [D, F] weights (indexed, not copied) and
    scatter-adds w·y into the output; the backward adds each block's weight gradient into its expert's
    slice only. C = 0 (small M/E, e.g. decode) leaves the pure block scheme.
  Cost: the capacity part is E·C ≤ M slot rows of batched matmuls; the overflow part ⌈o_e/b⌉·b rows per
  expert, o_e = max(c_e − C, 0), at per-block matmul speed (the backward recomputes h, u for them). A skewed
  routing both empties slots and overflows rows (up to E·C + M ≈ 2M rows when all rows pick one expert), so
  when the overflow O = Σ_e o_e exceeds max_overflow·M (default M/4) a `lax.cond` runs the pure block scheme
  (C = 0: M rows plus at most min(E, M)·(b − 1) padding rows, one loop step per filled block) instead.
  Worst case (all M rows to one expert): the pure block scheme, ⌈M/b⌉ loop steps of b rows, plus the
  index arithmetic of the switch. Forward and backward are O(M·D·F) for every routing, independent of E.

Both are plain gathers and matmuls, hence differentiable (training) and jit-able; matmuls accumulate in fp32.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

IMPLS = ("ragged", "block")


def default_impl() -> str:
    """The grouped-matmul scheme that is fastest on the default backend."""
    return "block" if jax.default_backend() == "cpu" else "ragged"


def resolve_impl(name: str) -> str:
    """A config's `moe_impl` ("auto", "block" or "ragged") as the scheme to use: "auto" = `default_impl()`."""
    return default_impl() if name == "auto" else name


def default_capacity(num_rows: int, num_experts: int) -> int:
    """Capacity C of the "block" scheme: the mean group M/E rounded down to a multiple of 8 (0 below 8).

    Groups near the mean fill their slots, and the few rows past C go to the overflow loop.
    """
    return int(num_rows // max(1, num_experts) // 8 * 8)


def default_block_size(num_rows: int, num_experts: int) -> int:
    """Block size b of the pure block scheme (C = 0, or a skewed routing): a power of two near a quarter of
    the mean group M/E, in [1, 256] (1 for decode).

    Padding wastes about E·b/2 rows, i.e. ~1/8 of M at b = M/(4E), while large blocks keep each matmul
    efficient when groups are big (measured on CPU: 2048 tokens top-4 of 64 experts, b = 32 is fastest; of 8
    experts, b = 256).
    """
    quarter = max(1, num_rows // (4 * max(1, num_experts)))
    return int(min(256, 1 << (quarter.bit_length() - 1)))


def overflow_block_size(num_rows: int, num_experts: int) -> int:
    """Overflow block size of the capacity scheme: the power of two at or above √(M/E), in [1, 256].

    An expert's overflow is the excess of its group over the mean, about √(M/E) rows for a balanced router
    (Poisson-like counts), so b ≈ √(M/E) pads little while keeping the loop short (measured on CPU, 2048
    tokens top-4 of 64 experts: b = 16; of 8 experts: b = 16 to 32).
    """
    mean = max(1, num_rows // max(1, num_experts))
    return int(min(256, 1 << (math.isqrt(mean - 1)).bit_length()))


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


def _num_blocks(num_rows: int, num_experts: int, capacity: int, block: int) -> int:
    """Static bound on the overflow blocks Σ_e ⌈o_e / b⌉, o_e = max(c_e − C, 0), over all routings.

    With k overflowing experts, Σ_e o_e ≤ M − k·C (each holds C + o_e of the M rows) and
    k ≤ min(E, ⌊M/(C+1)⌋), so Σ_e ⌈o_e/b⌉ ≤ (M + k·(b − 1 − C)) / b, linear in k: its maximum is at k = 1
    or at the largest k.
    C = 0 gives the pure block scheme's ⌊(M + min(E, M)·(b − 1)) / b⌋.
    """
    k_max = min(num_experts, num_rows // (capacity + 1))
    if k_max == 0:
        return 1
    return max(1, *((num_rows + k * (block - 1 - capacity)) // block for k in (1, k_max)))


class _Layout(NamedTuple):
    """Where each of the M = N·X assignments (flat index n·X + j) goes; see `_layout`."""

    slot_assign: jax.Array  # [E·C] assignment in capacity slot e·C + r (clipped for an empty slot)
    slot_valid: jax.Array  # [E·C] the slot holds an assignment
    cap_pos: jax.Array  # [N, X] capacity slot e·C + rank of assignment (n, j) (meaningful where in_cap)
    in_cap: jax.Array  # [N, X] rank < C
    block_expert: jax.Array  # [nb] expert of each overflow block
    row_assign: jax.Array  # [nb·b] assignment in each overflow row (clipped for padding)
    row_valid: jax.Array  # [nb·b] the row holds an assignment (False for padding)
    used_blocks: jax.Array  # scalar: blocks actually filled, Σ_e ⌈o_e / b⌉ ≤ nb


def _layout(flat_idx: jax.Array, num_experts: int, num_x: int, capacity: int, block: int) -> _Layout:
    """Split the expert-sorted assignments into capacity slots and expert-pure overflow blocks.

    Assignment i of expert e with rank r_i (its position within e's sorted group) goes to capacity slot
    e·C + r_i if r_i < C; otherwise to overflow row p_e + (r_i − C) where p_e = Σ_{e'<e} b·⌈o_e'/b⌉, so every
    block of b overflow rows belongs to one expert.
    """
    m = flat_idx.shape[0]
    order, inverse, sizes = _sort_by_expert(flat_idx, num_experts)
    row_start = jnp.cumsum(sizes) - sizes
    rank = inverse - row_start[flat_idx]
    r = jnp.arange(capacity, dtype=jnp.int32)
    slot_assign = order[jnp.minimum(row_start[:, None] + r, m - 1).reshape(-1)]
    slot_valid = (r < sizes[:, None]).reshape(-1)
    cap_pos = (flat_idx * capacity + jnp.minimum(rank, max(capacity - 1, 0))).reshape(-1, num_x)
    in_cap = (rank < capacity).reshape(-1, num_x)
    over = jnp.maximum(sizes - capacity, 0)
    nb = _num_blocks(m, num_experts, capacity, block)
    padded = (over + block - 1) // block * block
    pad_end = jnp.cumsum(padded)
    pad_start = pad_end - padded
    block_expert = jnp.searchsorted(pad_end, jnp.arange(nb, dtype=jnp.int32) * block, side="right")
    block_expert = jnp.minimum(block_expert, num_experts - 1).astype(jnp.int32)
    row_expert = jnp.repeat(block_expert, block, total_repeat_length=nb * block)
    local = jnp.arange(nb * block, dtype=jnp.int32) - pad_start[row_expert]
    row_valid = (local >= 0) & (local < over[row_expert])
    row_assign = order[jnp.clip(row_start[row_expert] + capacity + local, 0, m - 1)]
    return _Layout(slot_assign, slot_valid, cap_pos, in_cap, block_expert, row_assign, row_valid,
                   (pad_end[-1] // block).astype(jnp.int32))


@jax.custom_vjp
def _gather_rows(src, idx, valid, inv_pos, inv_valid):
    """out[s] = src[idx[s]] where valid[s], else 0: rows [S, D] picked from src [N, D].

    (inv_pos [N, X], inv_valid) is the inverse map: row n feeds exactly the valid slots inv_pos[n, j] with
    inv_valid[n, j]. The transpose is then the gather-and-sum `_sum_rows`, not a scatter-add.
    """
    return jnp.where(valid[:, None], src[idx], jnp.zeros((), src.dtype))


@jax.custom_vjp
def _sum_rows(src, pos, valid, inv_idx, inv_valid):
    """out[n] = Σ_j src[pos[n, j]] over valid (n, j), in fp32, cast to src.dtype: the transpose of `_gather_rows`."""
    picked = jnp.where(valid[..., None], src[pos], jnp.zeros((), src.dtype))
    return jnp.sum(picked, axis=1, dtype=jnp.float32).astype(src.dtype)


def _gather_rows_fwd(src, idx, valid, inv_pos, inv_valid):
    return _gather_rows(src, idx, valid, inv_pos, inv_valid), (idx, valid, inv_pos, inv_valid)


def _gather_rows_bwd(res, d):
    idx, valid, inv_pos, inv_valid = res
    return _sum_rows(d, inv_pos, inv_valid, idx, valid), None, None, None, None


def _sum_rows_fwd(src, pos, valid, inv_idx, inv_valid):
    return _sum_rows(src, pos, valid, inv_idx, inv_valid), (pos, valid, inv_idx, inv_valid)


def _sum_rows_bwd(res, d):
    pos, valid, inv_idx, inv_valid = res
    return _gather_rows(d, inv_idx, inv_valid, pos, valid), None, None, None, None


_gather_rows.defvjp(_gather_rows_fwd, _gather_rows_bwd)
_sum_rows.defvjp(_sum_rows_fwd, _sum_rows_bwd)


def _capacity_ffn(x, w_flat, w_gate, w_up, w_down, lay: _Layout) -> jax.Array:
    """Σ_j w[n,j]·SwiGLU_e(x[n]) over the assignments in capacity: batched [E, C, D] matmuls; fp32 [N, D].

    Plain autodiff through the einsums; the dispatch/combine gathers transpose into gathers (`_gather_rows`).
    """
    num_experts, num_x = w_gate.shape[0], lay.cap_pos.shape[1]
    tok = lay.slot_assign // num_x
    xin = _gather_rows(x, tok, lay.slot_valid, lay.cap_pos, lay.in_cap).reshape(num_experts, -1, x.shape[1])
    h = jnp.einsum("ECD,EDF->ECF", xin, w_gate, preferred_element_type=jnp.float32)
    u = jnp.einsum("ECD,EDF->ECF", xin, w_up, preferred_element_type=jnp.float32)
    y = jnp.einsum("ECF,EFD->ECD", _swiglu(h, u, x.dtype), w_down, preferred_element_type=jnp.float32)
    ws = jnp.where(lay.slot_valid, w_flat[lay.slot_assign].astype(jnp.float32), 0.0)
    return _sum_rows(y.reshape(ws.shape[0], -1) * ws[:, None], lay.cap_pos, lay.in_cap, tok, lay.slot_valid)


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _dot_t(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ bᵀ in fp32."""
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _block_rows(i, block_expert, row_assign, row_valid, w_flat, num_x: int):
    """Block i's expert, its rows' tokens and assignments, and their routing weights (0 on padding rows)."""
    b = row_assign.shape[0] // block_expert.shape[0]
    rows = jax.lax.dynamic_slice_in_dim(row_assign, i * b, b)
    valid = jax.lax.dynamic_slice_in_dim(row_valid, i * b, b)
    wb = jnp.where(valid, w_flat[rows].astype(jnp.float32), 0.0)
    return block_expert[i], rows // num_x, rows, valid, wb


@jax.custom_vjp
def _blocks_ffn(x, w_flat, w_gate, w_up, w_down, block_expert, row_assign, row_valid, used_blocks):
    """Σ over the rows of expert-pure blocks of w·SwiGLU_e(x[token]), scattered into fp32 [N, D].

    Block i has rows row_assign[i·b : (i+1)·b] (assignments n·X + j) and expert block_expert[i]; one loop step
    per block, for the first `used_blocks` blocks only (a dynamic trip count: the static bound of
    `_num_blocks` costs index arithmetic only). Rows with row_valid False carry weight 0 and add nothing.
    """
    num_x = w_flat.shape[0] // x.shape[0]

    def step(i, y):
        e, tok, _, _, wb = _block_rows(i, block_expert, row_assign, row_valid, w_flat, num_x)
        xb = x[tok]
        a = _swiglu(_dot(xb, w_gate[e]), _dot(xb, w_up[e]), x.dtype)
        return y.at[tok].add(_dot(a, w_down[e]) * wb[:, None])

    return jax.lax.fori_loop(0, used_blocks, step, jnp.zeros(x.shape, jnp.float32))


def _blocks_fwd(x, w_flat, w_gate, w_up, w_down, block_expert, row_assign, row_valid, used_blocks):
    args = (x, w_flat, w_gate, w_up, w_down, block_expert, row_assign, row_valid, used_blocks)
    return _blocks_ffn(*args), args


def _blocks_bwd(res, dy):
    """Per used block (h, u recomputed): g = dy Wᵈᵀ; dw = ⟨g, a⟩; da = w·g; dh = da ⊙ u ⊙ silu'(h);
    du = da ⊙ silu(h); dx += dh W_gᵀ + du W_uᵀ; dW_g[e] += xᵀ dh, dW_u[e] += xᵀ du, dW_d[e] += aᵀ (w·dy).

    Gradients go into expert e's slice only: the cost is O(used blocks · b · D · F), independent of E.
    """
    x, w_flat, w_gate, w_up, w_down, block_expert, row_assign, row_valid, used_blocks = res
    num_x = w_flat.shape[0] // x.shape[0]

    def step(i, carry):
        dx, dw, dg, du_w, dd = carry
        e, tok, rows, valid, wb = _block_rows(i, block_expert, row_assign, row_valid, w_flat, num_x)
        xb, dyb = x[tok], dy[tok]
        h, u = _dot(xb, w_gate[e]), _dot(xb, w_up[e])
        sig = jax.nn.sigmoid(h)
        silu = h * sig
        a = (silu * u).astype(x.dtype)
        g = _dot_t(dyb.astype(w_down.dtype), w_down[e])
        dw = dw.at[rows].add(jnp.where(valid, jnp.sum(g * a.astype(jnp.float32), axis=1), 0.0))
        da = g * wb[:, None]
        dh = (da * u * sig * (1.0 + h * (1.0 - sig))).astype(x.dtype)
        du = (da * silu).astype(x.dtype)
        dx = dx.at[tok].add(_dot_t(dh, w_gate[e]) + _dot_t(du, w_up[e]))
        dg = dg.at[e].add(_dot(xb.T, dh))
        du_w = du_w.at[e].add(_dot(xb.T, du))
        dd = dd.at[e].add(_dot(a.T, (dyb * wb[:, None]).astype(x.dtype)))
        return dx, dw, dg, du_w, dd

    zeros = [jnp.zeros(a.shape, jnp.float32) for a in (x, w_flat, w_gate, w_up, w_down)]
    grads = jax.lax.fori_loop(0, used_blocks, step, tuple(zeros))
    cast = tuple(g.astype(a.dtype) for g, a in zip(grads, (x, w_flat, w_gate, w_up, w_down)))
    return (*cast, None, None, None, None)


_blocks_ffn.defvjp(_blocks_fwd, _blocks_bwd)


def _grouped_ffn(x, top_w, flat_idx, weights, block: int, capacity: int, layer=None) -> jax.Array:
    """Capacity part (if C > 0) plus blocks of b rows (dynamic loop); returns fp32 [N, D], already combined.

    With `layer`, the weights are stacks [L, E, ...] viewed as [L·E, ...] (a free reshape) and both parts run
    as loops of expert-pure blocks reading expert layer·E + e in place (the capacity part as E blocks of C
    rows): the layer's [E, ...] weights are never copied out of the stack, which measured faster than a
    batched einsum on a dynamic slice of the stack (prefill), and decode has C = 0 anyway.
    """
    num_experts, num_x = weights[0].shape[-3], top_w.shape[1]
    lay = _layout(flat_idx, num_experts, num_x, capacity, block)
    w_flat = top_w.reshape(-1)
    if layer is None:
        y = _blocks_ffn(x, w_flat, *weights, lay.block_expert, lay.row_assign, lay.row_valid, lay.used_blocks)
        return y + _capacity_ffn(x, w_flat, *weights, lay) if capacity > 0 else y
    offset = layer * num_experts
    merged = tuple(w.reshape(-1, *w.shape[2:]) for w in weights)
    y = _blocks_ffn(x, w_flat, *merged, lay.block_expert + offset, lay.row_assign, lay.row_valid, lay.used_blocks)
    if capacity == 0:
        return y
    experts = jnp.arange(num_experts, dtype=jnp.int32) + offset
    return y + _blocks_ffn(x, w_flat, *merged, experts, lay.slot_assign, lay.slot_valid, jnp.int32(num_experts))


def _block_ffn(x, top_w, flat_idx, weights, blocks, capacity: int, max_overflow: float, layer=None) -> jax.Array:
    """The capacity scheme while its overflow O = Σ_e max(c_e − C, 0) is at most max_overflow·M, else the pure
    block scheme.

    A skewed routing leaves many capacity slots empty *and* sends many rows to the overflow loop (together
    up to ~2M rows); the pure block scheme then costs less (M rows plus padding). `lax.cond` runs one of the
    two (both compiled), so the cost is min(both) up to the index arithmetic. blocks = (overflow b, pure b).
    """
    if capacity == 0:
        return _grouped_ffn(x, top_w, flat_idx, weights, blocks[1], 0, layer)
    sizes = jnp.bincount(flat_idx, length=weights[0].shape[-3])
    overflow = jnp.sum(jnp.maximum(sizes - capacity, 0))
    return jax.lax.cond(overflow <= max_overflow * flat_idx.shape[0],
                        lambda: _grouped_ffn(x, top_w, flat_idx, weights, blocks[0], capacity, layer),
                        lambda: _grouped_ffn(x, top_w, flat_idx, weights, blocks[1], 0, layer))


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
    capacity: int | None = None,
    max_overflow: float = 0.25,
) -> jax.Array:
    """Σ_j top_w[n,j] · SwiGLU_e(x[n]) with e = top_idx[n,j], dropless and sparse (see module docstring).

    Args:
      x: [N, D] tokens. top_idx: [N, X] int expert ids in [0, E). top_w: [N, X] routing weights.
      w_gate, w_up: [E, D, F]. w_down: [E, F, D].
      impl: "ragged" or "block"; None picks per backend (`default_impl`).
      block_size: block size b for "block", of the overflow blocks and of the pure block scheme (None:
        `overflow_block_size` and `default_block_size`).
      layer: if given, w_gate/w_up/w_down are per-layer stacks [L, E, ...] and layer (a traced or static
        index) selects one (see `_block_ffn`).
      capacity: capacity C per expert for "block" (None: `default_capacity`; 0: pure block scheme).
      max_overflow: "block" runs the pure block scheme instead when more than this fraction of the N·X rows
        overflow the capacity (a skewed routing; see `_block_ffn`). 1.0: never.
    Returns:
      [N, D] in x.dtype (matmuls and the weighted sum accumulate in fp32).
    """
    x, top_idx, top_w, w_gate, w_up, w_down = map(jnp.asarray, (x, top_idx, top_w, w_gate, w_up, w_down))
    _check(x, top_idx, top_w, w_gate, w_up, w_down, layer is not None)
    impl = impl or default_impl()
    if impl not in IMPLS:
        raise ValueError(f"expert_ffn: impl must be one of {IMPLS}, got {impl!r}")
    n, d = x.shape
    num_x, num_experts = top_idx.shape[1], w_gate.shape[-3]
    flat_idx = top_idx.reshape(-1).astype(jnp.int32)
    if impl == "ragged":
        if layer is not None:
            w_gate, w_up, w_down = (jax.lax.dynamic_index_in_dim(w, layer, keepdims=False)
                                    for w in (w_gate, w_up, w_down))
        y = _ragged_ffn(x, flat_idx, w_gate, w_up, w_down, num_x).reshape(n, num_x, d)
        return jnp.einsum("NXD,NX->ND", y, top_w.astype(jnp.float32)).astype(x.dtype)
    m = n * num_x
    cap = default_capacity(m, num_experts) if capacity is None else capacity
    blocks = (block_size or overflow_block_size(m, num_experts), block_size or default_block_size(m, num_experts))
    if min(blocks) < 1 or cap < 0:
        raise ValueError(f"expert_ffn: block_size must be >= 1 and capacity >= 0, got {block_size}, {capacity}")
    weights = (w_gate, w_up, w_down)
    out = _block_ffn(x, top_w, flat_idx, weights, tuple(map(int, blocks)), int(cap), float(max_overflow), layer)
    return out.astype(x.dtype)
