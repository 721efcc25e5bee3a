"""Bradley–Terry preference (RECIPE.md §4): the symmetric training loss and the order-averaged preference.

Everything here is over scores, not models. Δ(x, a, b) is the logit that a is preferred to b. Two scorer
conventions produce it (RECIPE.md §4 decision):

- pointwise: a scalar head scores each response alone, Δ(x, a, b) = s(x, a) − s(x, b); then
  Δ(x, b, a) = −Δ(x, a, b) and order cannot matter (`pointwise_deltas`).
- pairwise: a head reads x‖a‖b and emits Δ(x, a, b) directly; Δ(x, b, a) comes from a second pass over x‖b‖a
  and need not be −Δ(x, a, b) (position bias) (`pairwise_deltas`).

`bt_loss` and `bt_preference` take both orders, so the symmetric loss and the permutation average hold for
either convention.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _same_shape(name: str, **arrays: jax.Array) -> None:
    shapes = {k: jnp.shape(v) for k, v in arrays.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"{name}: shapes must match, got {shapes}")


def pointwise_deltas(score_a: jax.Array, score_b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(Δ_ab, Δ_ba) = (s_a − s_b, s_b − s_a) from pointwise scores s(x, a), s(x, b)."""
    _same_shape("pointwise_deltas", score_a=score_a, score_b=score_b)
    delta = jnp.asarray(score_a, jnp.float32) - jnp.asarray(score_b, jnp.float32)
    return delta, -delta


def pairwise_deltas(logit_ab: jax.Array, logit_ba: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(Δ_ab, Δ_ba) from a pairwise head run on x‖a‖b and on x‖b‖a: each pass's logit is Δ for its order."""
    _same_shape("pairwise_deltas", logit_ab=logit_ab, logit_ba=logit_ba)
    return jnp.asarray(logit_ab, jnp.float32), jnp.asarray(logit_ba, jnp.float32)


def bt_nll(delta: jax.Array, label: jax.Array) -> jax.Array:
    """ℓ_BT = −[r log σ(Δ) + (1 − r) log(1 − σ(Δ))], elementwise, via log σ for stability (r may be soft)."""
    delta = jnp.asarray(delta, jnp.float32)
    label = jnp.asarray(label, jnp.float32)
    return -(label * jax.nn.log_sigmoid(delta) + (1.0 - label) * jax.nn.log_sigmoid(-delta))


def bt_loss(
    delta_ab: jax.Array, delta_ba: jax.Array, label: jax.Array, mask: jax.Array | None = None
) -> jax.Array:
    """Symmetric Bradley–Terry loss, mean over the (valid) pairs of the batch (RECIPE.md §4, L_sym).

        L_sym = ½ ℓ_BT(Δ(x, a, b), r) + ½ ℓ_BT(Δ(x, b, a), 1 − r)

    Args:
      delta_ab: [...] Δ(x, y_a, y_b); delta_ba: [...] Δ(x, y_b, y_a) (see the module docstring).
      label: [...] r ∈ {0, 1} (or a soft label in [0, 1]): 1 when y_a is preferred.
      mask: optional [...] validity mask of the pairs.

    Invariant: swapping the pair and flipping the label leaves the loss unchanged.
    """
    _same_shape("bt_loss", delta_ab=delta_ab, delta_ba=delta_ba, label=label)
    per_pair = 0.5 * bt_nll(delta_ab, label) + 0.5 * bt_nll(delta_ba, 1.0 - jnp.asarray(label, jnp.float32))
    if mask is None:
        return per_pair.mean()
    _same_shape("bt_loss", delta_ab=delta_ab, mask=mask)
    mask = jnp.asarray(mask, bool)
    return jnp.where(mask, per_pair, 0.0).sum() / jnp.maximum(mask.sum(), 1)


def bt_preference(delta_ab: jax.Array, delta_ba: jax.Array) -> jax.Array:
    """Order-averaged preference P̄ = σ(Δ̄), Δ̄ = ½[Δ(x, a, b) − Δ(x, b, a)] (RECIPE.md §4).

    With a = the policy rollout y_i and b = the reference model's rollout, this is s(τ_i) ∈ [0, 1].
    Invariant: bt_preference(Δ_ab, Δ_ba) = 1 − bt_preference(Δ_ba, Δ_ab).
    """
    _same_shape("bt_preference", delta_ab=delta_ab, delta_ba=delta_ba)
    delta_bar = 0.5 * (jnp.asarray(delta_ab, jnp.float32) - jnp.asarray(delta_ba, jnp.float32))
    return jax.nn.sigmoid(delta_bar)


def consensus_labels(
    votes: jax.Array, valid: jax.Array | None = None, *, min_agreement: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    """Label-noise filter (RECIPE.md §4): keep only preference pairs on which the annotating models agree.

        label_p = 1 if the majority of valid votes prefer a (ties -> 0.5, never kept)
        keep_p  = (share of valid votes agreeing with the majority ≥ min_agreement) and ≥ 1 valid vote

    Args:
      votes: [P, M] in {0, 1}: model m prefers y_a on pair p.  valid: optional [P, M] mask of cast votes.
      min_agreement: 1.0 (default) keeps unanimous pairs only; e.g. 2/3 keeps two-out-of-three majorities.

    Returns:
      (label [P] float32 for `bt_loss`, keep [P] bool, usable as its mask).
    """
    votes = jnp.asarray(votes, jnp.float32)
    if votes.ndim != 2:
        raise ValueError(f"consensus_labels: votes must be [P, M], got shape {votes.shape}")
    if not 0.5 < min_agreement <= 1.0:
        raise ValueError(f"consensus_labels: min_agreement must be in (0.5, 1], got {min_agreement}")
    valid = jnp.ones(votes.shape, bool) if valid is None else jnp.asarray(valid, bool)
    _same_shape("consensus_labels", votes=votes, valid=valid)
    count = valid.sum(axis=-1)
    share_a = jnp.where(valid, votes, 0.0).sum(axis=-1) / jnp.maximum(count, 1)
    label = jnp.where(share_a > 0.5, 1.0, jnp.where(share_a < 0.5, 0.0, 0.5))
    agreement = jnp.maximum(share_a, 1.0 - share_a)
    keep = (count > 0) & (share_a != 0.5) & (agreement >= min_agreement - 1e-6)
    return label, keep
