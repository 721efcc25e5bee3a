"""Efficiency penalties (RECIPE.md §4): anchored, group-relative tool and length penalties, and the
unconditional (linear) baselines the write-up rejected, kept as ablations.

All functions work on a [N groups, G rollouts] layout with an optional validity mask (padded rollouts / groups
are False); outputs are 0 on invalid entries and finite everywhere.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from searchjax.losses.advantages import as_mask, masked_group_mean


def _grid(name: str, mask: jax.Array | None, **arrays: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
    """Checks that every array is [N, G] with one shape; returns them as float32 and the boolean mask."""
    shapes = {k: jnp.shape(v) for k, v in arrays.items()}
    first = next(iter(shapes.values()))
    if len(first) != 2 or len(set(shapes.values())) > 1:
        raise ValueError(f"{name}: expected [N, G] arrays of one shape, got {shapes}")
    return {k: jnp.asarray(v, jnp.float32) for k, v in arrays.items()}, as_mask(mask, first, name)


def tool_baseline_range(effective_calls: jax.Array, winners: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The closed range of b_g: (min_{j∈W_g} c̃_j, ⌈mean_{j∈W_g} c̃_j⌉, W_g non-empty), each [N]."""
    lo = jnp.where(winners, effective_calls, jnp.inf).min(axis=-1)
    mean, count = masked_group_mean(effective_calls, winners)
    has = count > 0
    return jnp.where(has, lo, 0.0), jnp.where(has, jnp.ceil(mean), 0.0), has


def draw_tool_baseline(
    effective_calls: jax.Array, winners: jax.Array, key: jax.Array, *, continuous: bool = False
) -> jax.Array:
    """b_g ~ Unif(min_{j∈W_g} c̃_j, ⌈mean_{j∈W_g} c̃_j⌉) per group, [N] float32 (RECIPE.md §4 decision).

    Integer (default): uniform over the integers of the closed range. continuous=True: uniform real on it.
    A group without winners gets 0 (unused: its Δ_i is 0, see `tool_penalty`).
    """
    lo, hi, _ = tool_baseline_range(effective_calls, winners)
    (n,) = lo.shape
    if continuous:
        return jax.random.uniform(key, (n,), minval=lo, maxval=hi)
    lo_i, hi_i = jnp.ceil(lo).astype(jnp.int32), hi.astype(jnp.int32)
    return jax.random.randint(key, (n,), lo_i, hi_i + 1).astype(jnp.float32)


def tool_penalty(
    calls: jax.Array,
    failures: jax.Array,
    correct: jax.Array,
    *,
    key: jax.Array | None = None,
    baseline: jax.Array | None = None,
    alpha_win: float,
    alpha_lose: float,
    beta_lose: float,
    mask: jax.Array | None = None,
    continuous: bool = False,
) -> jax.Array:
    """Anchored tool-call penalty pen_tool [N, G] (RECIPE.md §4).

        c̃_i = c_i − e_i,   W_g = {i : r_base(τ_i) = 1},   b_g ~ Unif(min_{W_g} c̃, ⌈mean_{W_g} c̃⌉)
        Δ_i = max(0, c̃_i − b_g),   p_i = 1 − exp(−Δ_i)
        pen_tool = α_win p_i (i ∈ W_g),   α_lose p_i + β_lose (i ∉ W_g)

    Decision: if W_g is empty there is no anchor, Δ_i = 0 for the whole group (losers get β_lose only), also
    when `baseline` is given.

    Args:
      calls, failures: [N, G] tool calls c_i and failed executions e_i (counts, e_i ≤ c_i).
      correct: [N, G] r_base ∈ {0, 1}.
      key: PRNG key for the draw of b_g; baseline: [N] fixed b_g instead of drawing (ablations, tests).
      mask: [N, G] validity; invalid rollouts are neither winners nor penalised.
      continuous: draw b_g as a real number instead of an integer.
    """
    arrs, mask = _grid("tool_penalty", mask, calls=calls, failures=failures, correct=correct)
    eff = arrs["calls"] - arrs["failures"]
    win = (arrs["correct"] > 0.5) & mask
    _, _, has = tool_baseline_range(eff, win)
    if baseline is None:
        if key is None:
            raise ValueError("tool_penalty: pass either key (to draw b_g) or baseline ([N] fixed b_g)")
        baseline = draw_tool_baseline(eff, win, key, continuous=continuous)
    elif jnp.shape(baseline) != has.shape:
        raise ValueError(f"tool_penalty: baseline must be [N] = {has.shape}, got {jnp.shape(baseline)}")
    excess = jnp.where(has[:, None], jnp.maximum(0.0, eff - jnp.asarray(baseline, jnp.float32)[:, None]), 0.0)
    p = 1.0 - jnp.exp(-excess)
    pen = jnp.where(win, alpha_win * p, alpha_lose * p + beta_lose)
    return jnp.where(mask, pen, 0.0)


def _soft_excess(num: jax.Array, den: jax.Array) -> jax.Array:
    """1 − exp(−max(0, num/den − 1)), with the limits num/0 = +inf (num > 0) and 0/0 = 1 (no excess)."""
    safe = jnp.where(den > 0, den, 1.0)
    ratio = jnp.where(den > 0, num / safe, jnp.where(num > 0, jnp.inf, 1.0))
    return 1.0 - jnp.exp(-jnp.maximum(0.0, ratio - 1.0))


def length_penalty(
    lengths: jax.Array,
    ref_lengths: jax.Array,
    correct: jax.Array,
    preference: jax.Array,
    *,
    mask: jax.Array | None = None,
    max_length: int | None = None,
    preferred_threshold: float = 0.5,
) -> jax.Array:
    """Anchored length penalty pen_len [N, G] (RECIPE.md §4).

        Ŵ_g = {i ∈ W_g : s(τ_i) ≥ 0.5},   b_win = mean_{j∈Ŵ_g} L_j^ref,   b_lose = mean_{j∉Ŵ_g} L_j^ref
        pen_len = 1                                        if L_i > max_j L_j^cmp   (hard cap)
                  1 − exp(−max(0, L_i / b_win − 1))        if i ∈ Ŵ_g             (verbose winners)
                  1 − exp(−max(0, b_lose / L_i − 1))       otherwise              (too-short losers)

    Decisions: L^cmp is the group's reference lengths (valid rollouts), or `max_length` when given (the cap
    fires for L_i > max_length). A loser with L_i = 0 gets 1 (the limit), never NaN or inf; a zero reference
    mean is handled by the same limits. Means run over valid rollouts only.

    Args:
      lengths: [N, G] L_i, token length of rollout i.  ref_lengths: [N, G] L_i^ref, length of the reference
        model's generation paired with rollout i.  correct: [N, G] r_base.  preference: [N, G] s(τ_i).
      mask: [N, G] validity.  preferred_threshold: the 0.5 of Ŵ_g.
    """
    arrs, mask = _grid("length_penalty", mask, lengths=lengths, ref_lengths=ref_lengths, correct=correct,
                       preference=preference)
    length, ref = arrs["lengths"], arrs["ref_lengths"]
    shaping = (arrs["correct"] > 0.5) & (arrs["preference"] >= preferred_threshold) & mask
    b_win, _ = masked_group_mean(ref, shaping)
    b_lose, _ = masked_group_mean(ref, mask & ~shaping)
    if max_length is None:
        cap = jnp.where(mask, ref, -jnp.inf).max(axis=-1)
    else:
        cap = jnp.full(length.shape[:1], float(max_length))
    verbose = _soft_excess(length, b_win[:, None])
    # L_i = 0 is the limit b_lose / L_i -> inf: the decided value 1, whatever b_lose.
    short = jnp.where(length > 0, _soft_excess(b_lose[:, None], length), 1.0)
    pen = jnp.where(length > cap[:, None], 1.0, jnp.where(shaping, verbose, short))
    return jnp.where(mask, pen, 0.0)


def unconditional_tool_penalty(
    calls: jax.Array, failures: jax.Array, *, per_call: float, mask: jax.Array | None = None
) -> jax.Array:
    """Ablation (rejected in the write-up): pen_tool = per_call · c̃_i for every rollout, right or wrong."""
    arrs, mask = _grid("unconditional_tool_penalty", mask, calls=calls, failures=failures)
    return jnp.where(mask, per_call * (arrs["calls"] - arrs["failures"]), 0.0)


def unconditional_length_penalty(
    lengths: jax.Array, *, per_token: float, mask: jax.Array | None = None
) -> jax.Array:
    """Ablation (rejected in the write-up): pen_len = per_token · L_i for every rollout, right or wrong."""
    arrs, mask = _grid("unconditional_length_penalty", mask, lengths=lengths)
    return jnp.where(mask, per_token * arrs["lengths"], 0.0)


def efficiency_penalty(
    tool_pen: jax.Array, len_pen: jax.Array, *, lambda_tool: float, lambda_len: float
) -> jax.Array:
    """pen_eff = λ_tool · pen_tool + λ_len · pen_len (RECIPE.md §4)."""
    if jnp.shape(tool_pen) != jnp.shape(len_pen):
        raise ValueError(f"efficiency_penalty: shapes differ, {jnp.shape(tool_pen)} vs {jnp.shape(len_pen)}")
    return lambda_tool * jnp.asarray(tool_pen, jnp.float32) + lambda_len * jnp.asarray(len_pen, jnp.float32)
