"""Rewards (RECIPE.md §4): r_base (answers, rubrics), Bradley–Terry preference, anchored penalties, gating."""

from searchjax.rewards.aggregate import (
    RewardBreakdown,
    RolloutRecords,
    calls_covariance,
    compute_rewards,
    gated_reward,
    group_covariance,
    linear_reward,
    reward_metrics,
    reward_terms,
)
from searchjax.rewards.answers import (
    answer_correct,
    extract_answer,
    exact_match,
    normalize_answer,
    numbers_match,
    qa_correct,
    qa_r_base,
    rubric_r_base,
    token_f1,
)
from searchjax.rewards.bradley_terry import (
    bt_loss,
    bt_preference,
    consensus_labels,
    pairwise_deltas,
    pointwise_deltas,
)
from searchjax.rewards.config import RewardConfig
from searchjax.rewards.penalties import (
    draw_tool_baseline,
    efficiency_penalty,
    length_penalty,
    tool_penalty,
    unconditional_length_penalty,
    unconditional_tool_penalty,
)

__all__ = [
    "RewardBreakdown",
    "RewardConfig",
    "RolloutRecords",
    "calls_covariance",
    "answer_correct",
    "extract_answer",
    "bt_loss",
    "bt_preference",
    "compute_rewards",
    "consensus_labels",
    "draw_tool_baseline",
    "efficiency_penalty",
    "exact_match",
    "gated_reward",
    "group_covariance",
    "length_penalty",
    "linear_reward",
    "normalize_answer",
    "numbers_match",
    "pairwise_deltas",
    "pointwise_deltas",
    "qa_correct",
    "qa_r_base",
    "reward_metrics",
    "reward_terms",
    "rubric_r_base",
    "token_f1",
    "tool_penalty",
    "unconditional_length_penalty",
    "unconditional_tool_penalty",
]
