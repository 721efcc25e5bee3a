"""Gated reward aggregation (RECIPE.md §4) and the one-call reward computation for a batch of rollouts.

    R(τ_i) = r_base(τ_i) · s(τ_i) − pen_eff(τ_i)

`compute_rewards(batch, cfg, key)` turns rollout records laid out as [N groups, G rollouts] (+ validity mask)
into final rewards, GRPO advantages and every component for logging, in one pure function:
`jax.jit(compute_rewards, static_argnames="cfg")` runs the whole thing as a single XLA computation.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp

from searchjax.losses.advantages import as_mask, group_advantages, masked_group_mean
from searchjax.rewards.config import RewardConfig
from searchjax.rewards.penalties import (
    draw_tool_baseline,
    efficiency_penalty,
    length_penalty,
    tool_penalty,
    unconditional_length_penalty,
    unconditional_tool_penalty,
)


def gated_reward(r_base: jax.Array, preference: jax.Array, penalty: jax.Array) -> jax.Array:
    """R = r_base · s − pen_eff (RECIPE.md §4): preference only counts for a correct rollout (r_base = 1).

    A wrong answer (r_base = 0) gets R = −pen_eff ≤ 0 whatever its preference score.
    """
    return jnp.asarray(r_base, jnp.float32) * jnp.asarray(preference, jnp.float32) - jnp.asarray(penalty, jnp.float32)


def linear_reward(r_base: jax.Array, preference: jax.Array, penalty: jax.Array, *, weight: float) -> jax.Array:
    """Ablation: R = r_base + w · s − pen_eff, the plain linear sum the write-up found reward-hacked."""
    return (jnp.asarray(r_base, jnp.float32) + weight * jnp.asarray(preference, jnp.float32)
            - jnp.asarray(penalty, jnp.float32))


@flax.struct.dataclass
class RolloutRecords:
    """Per-rollout reward inputs, each [N groups, G rollouts].

    correct: r_base ∈ {0, 1} (QA answer correct / every rubric passed).  preference: s(τ_i) ∈ [0, 1].
    calls, failures: tool calls c_i and failed executions e_i.  lengths: L_i, generated tokens of rollout i.
    ref_lengths: L_i^ref, tokens of the reference model's generation paired with rollout i.
    mask: True for real rollouts, False for padding.
    """

    correct: jax.Array
    preference: jax.Array
    calls: jax.Array
    failures: jax.Array
    lengths: jax.Array
    ref_lengths: jax.Array
    mask: jax.Array


@flax.struct.dataclass
class RewardBreakdown:
    """Everything `compute_rewards` computed, [N, G] unless noted; 0 on invalid entries.

    reward: final R.  advantages: GRPO Â.  r_base, preference: the inputs (masked).  credit: the gated (or
    linear) preference credit before penalties.  tool_penalty, length_penalty: pen_tool, pen_len (before λ).
    efficiency_penalty: pen_eff.  tool_baseline: [N] b_g drawn (0 for groups without winners, and under the
    unconditional-penalty ablation).  mask: the validity mask.
    """

    reward: jax.Array
    advantages: jax.Array
    r_base: jax.Array
    preference: jax.Array
    credit: jax.Array
    tool_penalty: jax.Array
    length_penalty: jax.Array
    efficiency_penalty: jax.Array
    tool_baseline: jax.Array
    mask: jax.Array


def _check_records(batch: RolloutRecords) -> None:
    shapes = {name: jnp.shape(getattr(batch, name)) for name in batch.__dataclass_fields__}
    first = shapes["correct"]
    if len(first) != 2 or len(set(shapes.values())) > 1:
        raise ValueError(f"compute_rewards: every RolloutRecords field must be [N, G] of one shape, got {shapes}")


def _penalties(batch: RolloutRecords, cfg: RewardConfig, key: jax.Array, mask: jax.Array):
    """(pen_tool, pen_len, b_g) under the configured penalty scheme."""
    if cfg.penalties == "unconditional":
        tool = unconditional_tool_penalty(batch.calls, batch.failures, per_call=cfg.per_call, mask=mask)
        length = unconditional_length_penalty(batch.lengths, per_token=cfg.per_token, mask=mask)
        return tool, length, jnp.zeros(mask.shape[:1], jnp.float32)
    eff = jnp.asarray(batch.calls, jnp.float32) - jnp.asarray(batch.failures, jnp.float32)
    winners = (jnp.asarray(batch.correct, jnp.float32) > 0.5) & mask
    baseline = draw_tool_baseline(eff, winners, key, continuous=cfg.continuous_baseline)
    tool = tool_penalty(batch.calls, batch.failures, batch.correct, baseline=baseline, alpha_win=cfg.alpha_win,
                        alpha_lose=cfg.alpha_lose, beta_lose=cfg.beta_lose, mask=mask)
    length = length_penalty(batch.lengths, batch.ref_lengths, batch.correct, batch.preference, mask=mask,
                            max_length=cfg.max_length, preferred_threshold=cfg.preferred_threshold)
    return tool, length, baseline


def compute_rewards(batch: RolloutRecords, cfg: RewardConfig, key: jax.Array) -> RewardBreakdown:
    """Final rewards, advantages and components for a [N, G] batch of rollouts (RECIPE.md §4, §2).

        pen_eff = λ_tool · pen_tool + λ_len · pen_len
        R       = r_base · s − pen_eff            (cfg.aggregation = "gated")
                  r_base + w · s − pen_eff        (cfg.aggregation = "linear", ablation)
        Â       = group_advantages(R, mask, normalize_std=cfg.normalize_std, eps=cfg.adv_eps)

    Args:
      batch: RolloutRecords, every field [N, G].
      cfg: RewardConfig (static under jit).
      key: PRNG key for the tool baseline draw b_g.
    """
    _check_records(batch)
    mask = as_mask(batch.mask, jnp.shape(batch.correct), "compute_rewards")
    r_base = jnp.where(mask, jnp.asarray(batch.correct, jnp.float32), 0.0)
    pref = jnp.where(mask, jnp.asarray(batch.preference, jnp.float32), 0.0)
    tool, length, baseline = _penalties(batch, cfg, key, mask)
    pen = efficiency_penalty(tool, length, lambda_tool=cfg.lambda_tool, lambda_len=cfg.lambda_len)
    zero = jnp.zeros_like(pen)
    if cfg.aggregation == "gated":
        credit = gated_reward(r_base, pref, zero)
    else:
        credit = linear_reward(r_base, pref, zero, weight=cfg.linear_weight)
    reward = jnp.where(mask, credit - pen, 0.0)
    adv = group_advantages(reward, mask, normalize_std=cfg.normalize_std, eps=cfg.adv_eps)
    return RewardBreakdown(reward=reward, advantages=adv, r_base=r_base, preference=pref,
                           credit=jnp.where(mask, credit, 0.0), tool_penalty=tool, length_penalty=length,
                           efficiency_penalty=pen, tool_baseline=baseline, mask=mask)


def reward_metrics(out: RewardBreakdown) -> dict[str, jax.Array]:
    """Scalar logging summary: means over valid rollouts of every [N, G] component, plus group statistics."""
    mask = out.mask
    n = jnp.maximum(mask.sum(), 1)
    metrics = {
        name: jnp.where(mask, getattr(out, name), 0.0).sum() / n
        for name in ("reward", "r_base", "preference", "credit", "tool_penalty", "length_penalty",
                     "efficiency_penalty")
    }
    metrics["advantage_abs"] = jnp.abs(out.advantages).sum() / n
    groups = mask.any(axis=-1)
    winners = ((out.r_base > 0.5) & mask).any(axis=-1)
    metrics["frac_groups_with_winner"] = (winners & groups).sum() / jnp.maximum(groups.sum(), 1)
    metrics["n_rollouts"] = mask.sum().astype(jnp.float32)
    return metrics


REWARD_TERMS = ("correct", "preference", "tool", "length")


def reward_terms(out: RewardBreakdown, cfg: RewardConfig) -> dict[str, jax.Array]:
    """R split into additive [N, G] terms, R = correct + preference + tool + length on valid rollouts:

        gated:   correct = r_base · s̄_g        preference = r_base · (s − s̄_g)
        linear:  correct = r_base             preference = w · s
        tool = −λ_tool · pen_tool             length = −λ_len · pen_len

    s̄_g is the mean s over group g's winners (r_base = 1), so under the gated reward `correct` pays every winner
    of a group alike (being right) and `preference` is how s ranks the winners among themselves (0 on losers)."""
    mask, r_base = out.mask, out.r_base
    if cfg.aggregation == "gated":
        winners = mask & (r_base > 0.5)
        s_bar, _ = masked_group_mean(out.preference, winners)
        correct = r_base * s_bar[:, None]
    else:
        correct = r_base
    terms = {"correct": correct, "preference": out.credit - correct,
             "tool": -cfg.lambda_tool * out.tool_penalty, "length": -cfg.lambda_len * out.length_penalty}
    return {k: jnp.where(mask, v, 0.0) for k, v in terms.items()}


def group_covariance(a: jax.Array, b: jax.Array, mask: jax.Array) -> jax.Array:
    """The [N] within-group covariance of a and b [N, G] over each group's valid rollouts (population form),

        cov[g] = mean_{i∈g} (a_i − ā_g)(b_i − b̄_g),

    each centred by `group_advantages` (normalize_std=False); 0 for an empty group, var(a) for b = a."""
    centred = functools.partial(group_advantages, mask=mask, normalize_std=False)
    cov, _ = masked_group_mean(centred(jnp.asarray(a, jnp.float32)) * centred(jnp.asarray(b, jnp.float32)), mask)
    return cov


def calls_covariance(out: RewardBreakdown, calls: jax.Array, cfg: RewardConfig) -> dict[str, jax.Array]:
    """Which term of R pushes the number of tool calls, and which way: for each term k of `reward_terms` and
    each group g, the [N] covariance

        cov_k[g] = mean_{i∈g} Â^k_i · (c_i − c̄_g),   Â^k_i = (k_i − mean_{j∈g} k_j) · z_g

    with c_i the rollout's tool calls and z_g = 1 / (std_g R + eps) under rewards.normalize_std (else 1), so the
    terms' Â^k add up to the Â that `compute_rewards` returns and "total" is its covariance. > 0: the term's
    advantage is larger on the group's rollouts with more calls, and a policy-gradient step on it makes more
    calls likelier; < 0: fewer. A diagnostic of the reward's design (which term moves the calls), not a loss."""
    mask = out.mask
    z = jnp.ones(mask.shape[:1], jnp.float32)
    if cfg.normalize_std:
        z = 1.0 / (jnp.sqrt(group_covariance(out.reward, out.reward, mask)) + cfg.adv_eps)
    cov = {name: group_covariance(term, calls, mask) * z for name, term in reward_terms(out, cfg).items()}
    cov["total"] = sum(cov[k] for k in REWARD_TERMS)
    return cov
