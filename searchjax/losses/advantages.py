"""Group-relative advantages (RECIPE.md §2) over a [N groups, G rollouts] layout with a validity mask."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def as_mask(mask: jax.Array | None, shape: tuple[int, ...], name: str) -> jax.Array:
    """A boolean validity mask of `shape` (all valid when None); raises naming `name` on a shape mismatch."""
    if mask is None:
        return jnp.ones(shape, dtype=bool)
    if mask.shape != shape:
        raise ValueError(f"{name}: mask shape {mask.shape} must equal {shape}")
    return mask.astype(bool)


def masked_group_mean(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean of x [N, G] over the valid entries of each group -> ([N], valid count [N]); 0 for an empty group."""
    count = mask.sum(axis=-1)
    total = jnp.where(mask, x, 0).sum(axis=-1)
    return total / jnp.maximum(count, 1), count


def group_advantages(
    rewards: jax.Array,
    mask: jax.Array | None = None,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> jax.Array:
    """Group-relative advantages Â_i (RECIPE.md §2).

        Â_i = (R_i − mean_{j∈g} R_j) / (std_{j∈g} R_j + eps)     (normalize_std=True, the default)
        Â_i =  R_i − mean_{j∈g} R_j                               (normalize_std=False, the ablation)

    mean and std run over the valid rollouts of group g only; std is the population std (ddof = 0), so a group
    with one valid rollout (G = 1, or all but one padded) or with equal rewards gets Â = 0 exactly, never NaN
    (computed on R − max_g R, which changes nothing in exact arithmetic).

    Args:
      rewards: [N, G] float rewards R(τ_i).
      mask: optional [N, G] validity mask (padded groups / rollouts are False).
      normalize_std: divide by the group std + eps.
      eps: added to the std.

    Returns:
      [N, G] float32 advantages, 0 on invalid entries.
    """
    if rewards.ndim != 2:
        raise ValueError(f"group_advantages: rewards must be [N, G], got shape {rewards.shape}")
    rewards = rewards.astype(jnp.float32)
    mask = as_mask(mask, rewards.shape, "group_advantages")
    # Shift by the group's best valid reward first: an all-equal group becomes exactly 0 (a float32 mean of
    # equal values need not round back to the value, and ε would blow that rounding up to an O(1) advantage).
    best = jnp.where(mask, rewards, -jnp.inf).max(axis=-1, keepdims=True)
    shifted = jnp.where(mask, rewards - jnp.where(jnp.isfinite(best), best, 0.0), 0.0)
    mean, _ = masked_group_mean(shifted, mask)
    centred = jnp.where(mask, shifted - mean[:, None], 0.0)
    if normalize_std:
        var, _ = masked_group_mean(centred**2, mask)
        centred = centred / (jnp.sqrt(var)[:, None] + eps)
    return jnp.where(mask, centred, 0.0)
