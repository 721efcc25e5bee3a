"""Losses over arrays (RECIPE.md §1–§2): log-probs, group advantages, GRPO with token-level IS, SFT."""

from searchjax.losses.advantages import group_advantages, stratum_balanced_advantages
from searchjax.losses.grpo import grpo_loss, policy_loss, sequence_grpo_loss
from searchjax.losses.logprobs import token_logprobs, token_logprobs_from_logits
from searchjax.losses.sft import sft_loss, sft_loss_from_logprobs

__all__ = [
    "group_advantages",
    "grpo_loss",
    "policy_loss",
    "sequence_grpo_loss",
    "sft_loss",
    "sft_loss_from_logprobs",
    "stratum_balanced_advantages",
    "token_logprobs",
    "token_logprobs_from_logits",
]
