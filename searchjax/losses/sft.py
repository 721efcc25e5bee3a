"""Supervised warm-up loss (RECIPE.md §1, stage 1): token-mean cross entropy over assistant tokens only."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from searchjax.losses.logprobs import token_logprobs


def sft_loss_from_logprobs(
    logp: jax.Array, loss_mask: jax.Array
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Masked token-mean negative log-likelihood.

        loss = − Σ_{b,t} m_{b,t} log π(y_{b,t} | ·) / Σ_{b,t} m_{b,t}

    m is 1 on assistant tokens and 0 on system/user prompts, tool outputs and padding (the write-up trains only on
    assistant tokens, never on tool output). Every valid token of the batch weighs the same (token mean, not a
    per-sequence mean). An all-zero mask gives loss 0.

    Returns:
      (loss, metrics) with metrics nll (= loss), ppl = exp(nll), n_tokens.
    """
    if logp.shape != loss_mask.shape:
        raise ValueError(f"sft_loss: logp shape {logp.shape} must equal loss_mask shape {loss_mask.shape}")
    mask = loss_mask.astype(bool)
    n = mask.sum()
    nll = -jnp.where(mask, logp.astype(jnp.float32), 0.0).sum() / jnp.maximum(n, 1)
    metrics = {"nll": jax.lax.stop_gradient(nll), "ppl": jnp.exp(jax.lax.stop_gradient(nll)),
               "n_tokens": n.astype(jnp.float32)}
    return nll, metrics


def sft_loss(
    hidden: jax.Array,
    unembed: jax.Array,
    targets: jax.Array,
    loss_mask: jax.Array,
    *,
    chunk: int = 4096,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """SFT loss from final hidden states [B, T, D] and the unembedding [V, D], with chunked log-probs.

    `targets` [B, T] are the next-token ids (inputs shifted left by one); `loss_mask` [B, T] marks the
    assistant tokens being predicted. See `sft_loss_from_logprobs` for the maths.
    """
    return sft_loss_from_logprobs(token_logprobs(hidden, unembed, targets, chunk=chunk), loss_mask)
