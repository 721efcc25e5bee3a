"""The reward / GRPO-loss configuration: every coefficient of RECIPE.md §2 and §4 and the ablation switches.

The write-up does not publish α, β or λ: the defaults below are ours (chosen so that a correct rollout's
penalties stay below a typical preference score), and the ablation notebooks sweep them. Load from YAML with
`searchjax.config.load_yaml(RewardConfig, "configs/rewards/default.yaml")`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """Reward (RECIPE.md §4) and GRPO loss (§2) settings. Hashable: pass it as a static argument to jit.

    Anchored tool penalty (pen_tool):
      alpha_win: α_win, weight of p_i = 1 − exp(−Δ_i) for winners (r_base = 1).
      alpha_lose: α_lose, weight of p_i for losers.
      beta_lose: β_lose, flat penalty for every loser.
      continuous_baseline: draw b_g ~ U[min, ⌈mean⌉] as a real number instead of an integer (the default,
        RECIPE.md §4 decision).
    Anchored length penalty (pen_len):
      max_length: fixed hard cap L^cmp on rollout length; None (default) = the longest reference generation of
        the group (RECIPE.md §4 decision).
      preferred_threshold: s(τ_i) ≥ this puts a winner in the shaping set Ŵ_g (0.5 in the write-up).
    Efficiency and aggregation:
      lambda_tool, lambda_len: λ_tool, λ_len in pen_eff = λ_tool·pen_tool + λ_len·pen_len.
      aggregation: "gated" (R = r_base·s − pen_eff, the write-up) or "linear" (R = r_base + w·s − pen_eff,
        the reward-hackable ablation).
      linear_weight: w of the linear ablation.
      penalties: "anchored" (group-relative, the write-up) or "unconditional" (the rejected baseline:
        pen_tool = per_call·c̃_i, pen_len = per_token·L_i, for every rollout).
      per_call, per_token: coefficients of the unconditional penalties.
    Advantages and policy loss:
      normalize_std: divide by the group std (off = the no-std ablation); adv_eps: ε added to the std.
      is_cap: truncated-IS cap C on π/μ (None = the write-up's plain ratio).
      clip_eps: PPO clip ε for several optimizer steps per rollout batch (None = strictly on-policy).
      sequence_is: GSPO-style sequence-level geometric-mean ratio instead of token-level IS (ablation).
      norm_length: a constant L in place of each rollout's 1/|o_i| in the loss (Dr. GRPO's normalisation,
        ablation; None = the write-up's per-rollout token mean); token-level IS only.
    Answer matching (r_base for QA, searchjax.rewards.answers):
      answer_rel_tol, answer_abs_tol: numeric answers also match within max(rel·|gold|, abs) (besides
        agreeing at the gold's stated precision).
      answer_f1_threshold: also accept a prediction whose token F1 with an alias reaches this (None = EM only).
    """

    alpha_win: float = 1.0
    alpha_lose: float = 1.0
    beta_lose: float = 0.1
    continuous_baseline: bool = False
    max_length: int | None = None
    preferred_threshold: float = 0.5
    lambda_tool: float = 0.1
    lambda_len: float = 0.1
    aggregation: Literal["gated", "linear"] = "gated"
    linear_weight: float = 1.0
    penalties: Literal["anchored", "unconditional"] = "anchored"
    per_call: float = 1.0
    per_token: float = 1e-3
    normalize_std: bool = True
    adv_eps: float = 1e-6
    is_cap: float | None = None
    clip_eps: float | None = None
    sequence_is: bool = False
    norm_length: int | None = None
    answer_rel_tol: float = 0.0
    answer_abs_tol: float = 0.0
    answer_f1_threshold: float | None = None

    def __post_init__(self) -> None:
        nonneg = ("alpha_win", "alpha_lose", "beta_lose", "lambda_tool", "lambda_len", "per_call", "per_token",
                  "adv_eps", "answer_rel_tol", "answer_abs_tol")
        for name in nonneg:
            if getattr(self, name) < 0:
                raise TypeError(f"RewardConfig.{name}: expected >= 0, got {getattr(self, name)}")
        for name in ("is_cap", "clip_eps", "max_length", "norm_length"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise TypeError(f"RewardConfig.{name}: expected > 0 or null, got {value}")
        if self.clip_eps is not None and self.clip_eps >= 1:
            raise TypeError(f"RewardConfig.clip_eps: expected in (0, 1) or null, got {self.clip_eps}")
        if not 0.0 <= self.preferred_threshold <= 1.0:
            raise TypeError(f"RewardConfig.preferred_threshold: expected in [0, 1], got {self.preferred_threshold}")
        if self.answer_f1_threshold is not None and not 0.0 < self.answer_f1_threshold <= 1.0:
            raise TypeError(f"RewardConfig.answer_f1_threshold: expected in (0, 1] or null, "
                            f"got {self.answer_f1_threshold}")
        if self.sequence_is and self.clip_eps is not None:
            raise TypeError("RewardConfig: sequence_is and clip_eps cannot be combined (PPO clip is token-level)")
        if self.sequence_is and self.norm_length is not None:
            raise TypeError("RewardConfig: sequence_is and norm_length cannot be combined (the sequence-level ratio "
                            "has no token sum to normalise)")
        if self.aggregation not in ("gated", "linear"):
            raise TypeError(f"RewardConfig.aggregation: expected 'gated' or 'linear', got {self.aggregation!r}")
        if self.penalties not in ("anchored", "unconditional"):
            raise TypeError(f"RewardConfig.penalties: expected 'anchored' or 'unconditional', "
                            f"got {self.penalties!r}")
