"""GRPO with token-level importance sampling (RECIPE.md §2), its truncated / PPO-clipped / sequence-level variants.

Arrays in, (scalar loss, metrics) out. Rows of the [B, T] arrays are rollouts (B = N·G, groups flattened); a
row whose token mask is all False (a padded rollout) counts neither in B nor anywhere else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

if TYPE_CHECKING:  # the config lives with the rewards; only its is_cap / clip_eps / sequence_is are read here
    from searchjax.rewards.config import RewardConfig

sg = jax.lax.stop_gradient


def _check(logp, logp_infer, advantages, token_mask, name, logp_old=None) -> None:
    if logp.ndim != 2:
        raise ValueError(f"{name}: logp must be [B, T], got shape {logp.shape}")
    for label, arr in (("logp_infer", logp_infer), ("token_mask", token_mask), ("logp_old", logp_old)):
        if arr is not None and arr.shape != logp.shape:
            raise ValueError(f"{name}: {label} shape {arr.shape} must equal logp shape {logp.shape}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"{name}: advantages must be [B] = {logp.shape[:1]}, got {advantages.shape}")


def _masked_token_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of x over all valid tokens of the batch (0 when there are none)."""
    return jnp.where(mask, x, 0.0).sum() / jnp.maximum(mask.sum(), 1)


def _is_weight(log_w: jax.Array, is_cap: float | None) -> jax.Array:
    """IS weight w = exp(log_w) with gradient w·∇log_w; truncated at C: value min(w, C), gradient min(w, C)·∇log_w.

    Written as exp(log_w + sg(min(0, log C − log_w))), so the effective per-token weight never exceeds C,
    truncated tokens still contribute (at weight C) instead of being dropped, and a huge log_w cannot overflow.
    """
    if is_cap is None:
        return jnp.exp(log_w)
    if is_cap <= 0:
        raise ValueError(f"is_cap must be > 0 or None, got {is_cap}")
    return jnp.exp(log_w + sg(jnp.minimum(0.0, jnp.log(is_cap) - log_w)))


def _ratio_metrics(ratio, mask, log_mu_minus_pi, is_cap) -> dict[str, jax.Array]:
    ratio = sg(ratio)
    truncated = (ratio > is_cap) if is_cap is not None else jnp.zeros_like(mask)
    return {
        "kl_infer": _masked_token_mean(sg(log_mu_minus_pi), mask),
        "ratio_mean": _masked_token_mean(ratio, mask),
        "ratio_max": jnp.where(mask, ratio, 0.0).max(initial=0.0),  # ratios are > 0; 0 when empty
        "frac_truncated": _masked_token_mean(truncated.astype(jnp.float32), mask),
        "n_tokens": mask.sum().astype(jnp.float32),
    }


def grpo_loss(
    logp: jax.Array,
    logp_infer: jax.Array,
    advantages: jax.Array,
    token_mask: jax.Array,
    *,
    is_cap: float | None = None,
    clip_eps: float | None = None,
    logp_old: jax.Array | None = None,
    norm_length: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Negative GRPO objective with token-level importance sampling (RECIPE.md §2, eq. J(θ)).

        loss = −(1/B) Σ_i (1/|o_i|) Σ_{t valid} w_{i,t} Â_i,   r_{i,t} = exp(log π_θ − sg(log μ_infer))

    - plain (default): w = r. ∂loss/∂log π_{i,t} = −r_{i,t} Â_i / (B |o_i|) on valid tokens, 0 elsewhere.
    - `is_cap=C` (truncated IS): w has value min(r, C) and gradient min(r, C)·∇log π (see `_is_weight`).
    - `clip_eps=ε` with `logp_old` (several optimizer steps per rollout batch, PPO-style):
        w·Â = sg(ρ_old) · min(ρ Â, clip(ρ, 1−ε, 1+ε) Â),  ρ = exp(log π_θ − sg(log π_old)),
        ρ_old = exp(log π_old − log μ_infer), truncated at C when is_cap is set.
      With log π_old = log π_θ (first step) this equals the plain objective in value and gradient.

    |o_i| counts the valid tokens of row i (prompt, tool output and padding are masked out); B counts the
    rows with at least one valid token. `norm_length=L` (ablation) puts the constant L in place of every |o_i|
    (Dr. GRPO's normalisation): with 1/|o_i| a losing rollout's negative advantage is spread over its length, so
    a long wrong rollout is pushed down less per token than a short one; with 1/L every token weighs the same.

    Returns:
      (loss, metrics): kl_infer = mean over valid tokens of log μ − log π (the train–inference KL estimate),
      ratio_mean, ratio_max (of r = π_θ/μ), frac_truncated (share of valid tokens whose truncated weight
      exceeds C: r, or ρ_old = π_old/μ when clipping), n_tokens, and clip_frac when clipping.
    """
    _check(logp, logp_infer, advantages, token_mask, "grpo_loss", logp_old)
    if (clip_eps is None) != (logp_old is None):
        raise ValueError("grpo_loss: clip_eps and logp_old go together (PPO-clipped variant); got only one")
    if is_cap is not None and is_cap <= 0:
        raise ValueError(f"grpo_loss: is_cap must be > 0 or None, got {is_cap}")
    if clip_eps is not None and not 0 < clip_eps < 1:
        raise ValueError(f"grpo_loss: clip_eps must be in (0, 1), got {clip_eps}")
    if norm_length is not None and norm_length < 1:
        raise ValueError(f"grpo_loss: norm_length must be >= 1 or None, got {norm_length}")
    mask = token_mask.astype(bool)
    logp = logp.astype(jnp.float32)
    log_r = jnp.where(mask, logp - sg(logp_infer.astype(jnp.float32)), 0.0)
    ratio = jnp.exp(log_r)
    adv = advantages.astype(jnp.float32)[:, None]
    metrics = _ratio_metrics(ratio, mask, -log_r, is_cap)
    if clip_eps is None:
        objective = _is_weight(log_r, is_cap) * adv
    else:
        old = sg(jnp.where(mask, logp_old.astype(jnp.float32), 0.0))
        rho_old = jnp.exp(jnp.where(mask, old - sg(logp_infer.astype(jnp.float32)), 0.0))
        if is_cap is not None:  # the weight truncated here is π_old/μ, so that is what frac_truncated counts
            metrics["frac_truncated"] = _masked_token_mean((rho_old > is_cap).astype(jnp.float32), mask)
            rho_old = jnp.minimum(rho_old, is_cap)
        rho = jnp.exp(jnp.where(mask, logp, 0.0) - old)
        clipped = jnp.clip(rho, 1.0 - clip_eps, 1.0 + clip_eps)
        objective = rho_old * jnp.minimum(rho * adv, clipped * adv)
        metrics["clip_frac"] = _masked_token_mean(sg(clipped != rho).astype(jnp.float32), mask)
    n_tok = mask.sum(axis=-1)
    denominator = jnp.maximum(n_tok, 1) if norm_length is None else jnp.float32(norm_length)
    per_seq = jnp.where(mask, objective, 0.0).sum(axis=-1) / denominator
    n_seq = jnp.maximum((n_tok > 0).sum(), 1)
    return -per_seq.sum() / n_seq, metrics


def sequence_grpo_loss(
    logp: jax.Array,
    logp_infer: jax.Array,
    advantages: jax.Array,
    token_mask: jax.Array,
    *,
    is_cap: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Ablation: sequence-level IS (GSPO-style geometric-mean ratio) instead of the token-level ratio (§2).

        s_i = exp( (1/|o_i|) Σ_{t valid} (log π_θ − sg(log μ_infer)) ),   loss = −(1/B) Σ_i w_i Â_i

    with w_i = s_i, or truncated at C as in `grpo_loss`. ∂loss/∂log π_{i,t} = −w_i Â_i / (B |o_i|).
    Metrics as `grpo_loss`, with the ratio statistics taken over sequences and kl_infer over tokens.
    """
    _check(logp, logp_infer, advantages, token_mask, "sequence_grpo_loss")
    mask = token_mask.astype(bool)
    log_r = jnp.where(mask, logp.astype(jnp.float32) - sg(logp_infer.astype(jnp.float32)), 0.0)
    n_tok = mask.sum(axis=-1)
    has = n_tok > 0
    log_seq = log_r.sum(axis=-1) / jnp.maximum(n_tok, 1)
    seq_ratio = jnp.exp(log_seq)
    metrics = _ratio_metrics(seq_ratio, has, jnp.zeros_like(seq_ratio), is_cap)
    metrics["kl_infer"] = _masked_token_mean(sg(-log_r), mask)
    metrics["n_tokens"] = mask.sum().astype(jnp.float32)
    objective = jnp.where(has, _is_weight(log_seq, is_cap) * advantages.astype(jnp.float32), 0.0)
    return -objective.sum() / jnp.maximum(has.sum(), 1), metrics


def policy_loss(
    logp: jax.Array,
    logp_infer: jax.Array,
    advantages: jax.Array,
    token_mask: jax.Array,
    cfg: RewardConfig,
    *,
    logp_old: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The policy loss `cfg` selects: `sequence_grpo_loss` when cfg.sequence_is, else `grpo_loss` with
    cfg.is_cap, cfg.norm_length and, when cfg.clip_eps is set, the PPO clip against `logp_old` (required then)."""
    if cfg.sequence_is:
        return sequence_grpo_loss(logp, logp_infer, advantages, token_mask, is_cap=cfg.is_cap)
    if cfg.clip_eps is not None and logp_old is None:
        raise ValueError("policy_loss: cfg.clip_eps is set, so logp_old (the behaviour log-probs) is required")
    return grpo_loss(logp, logp_infer, advantages, token_mask, is_cap=cfg.is_cap, clip_eps=cfg.clip_eps,
                     logp_old=logp_old if cfg.clip_eps is not None else None, norm_length=cfg.norm_length)
