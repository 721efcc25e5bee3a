"""Group-relative advantages (RECIPE.md §2) over a [N groups, G rollouts] layout with a validity mask, and their
rebalancing across strata of groups (an ablation of the GRPO loop, not in the write-up)."""

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


def stratum_balanced_advantages(
    advantages: jax.Array,
    strata: jax.Array,
    num_strata: int,
    mask: jax.Array | None = None,
    *,
    max_scale: float = 4.0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Rescale each group's advantages so every stratum of groups carries the same advantage mass in the batch.

    With groups g in strata k(g) (e.g. the hop count of a QA prompt), the mass of stratum k and its scale are

        M_k = Σ_{g: k(g)=k} Σ_{i valid} |Â_gi|,      M = Σ_k M_k,      K⁺ = #{k : M_k > 0}
        c_k = min(M / (K⁺ · M_k), max_scale)   if M_k > 0,    1 otherwise
        Â'_gi = c_{k(g)} · Â_gi

    so when no cap binds every stratum with signal ends with mass M / K⁺ and the batch's total mass M is kept.
    One stratum with signal (or none) gives c = 1, the plain advantages. A group is scaled by one constant, so its
    advantages keep their signs and their zero mean. `max_scale` bounds the weight of a stratum whose few mixed
    groups carry little mass (then the total mass is below M).

    Args:
      advantages: [N, G] group advantages (`group_advantages`).
      strata: [N] int stratum of each group, in [0, num_strata).
      num_strata: how many strata there are (static).
      mask: optional [N, G] validity mask.
      max_scale: the cap on c_k (> 0).

    Returns:
      (balanced advantages [N, G], each stratum's mass share M_k / M before balancing [num_strata] (0 when M = 0),
      the scales c_k [num_strata]).
    """
    if advantages.ndim != 2 or strata.shape != advantages.shape[:1]:
        raise ValueError(f"stratum_balanced_advantages: advantages must be [N, G] and strata [N], got "
                         f"{advantages.shape} and {strata.shape}")
    if max_scale <= 0:
        raise ValueError(f"stratum_balanced_advantages: max_scale must be > 0, got {max_scale}")
    advantages = advantages.astype(jnp.float32)
    mask = as_mask(mask, advantages.shape, "stratum_balanced_advantages")
    group_mass = jnp.where(mask, jnp.abs(advantages), 0.0).sum(axis=-1)
    mass = jax.ops.segment_sum(group_mass, strata, num_segments=num_strata)
    total = mass.sum()
    live = mass > 0
    target = total / jnp.maximum(live.sum(), 1)
    scale = jnp.where(live, jnp.minimum(target / jnp.where(live, mass, 1.0), max_scale), 1.0)
    share = jnp.where(total > 0, mass / jnp.where(total > 0, total, 1.0), 0.0)
    return jnp.where(mask, advantages * scale[strata][:, None], 0.0), share, scale
