"""Log-probabilities of sampled tokens, in float32, with and without materialising the logits.

For Qwen3.5 the vocabulary is V = 248,320: full float32 logits for B·T = 2,048 tokens already take 2 GB, and
their gradient as much again. `token_logprobs` therefore computes

    log π(y_t | ·) = h_t · W[:, y_t] − logsumexp_v (h_t · W[:, v])

over chunks of `chunk` tokens inside a `lax.map`, each chunk rematerialised (`jax.checkpoint`) on the backward
pass, so at most a [chunk, V] float32 block is alive at any time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _check_targets(targets: jax.Array, lead: tuple[int, ...], name: str) -> None:
    if targets.shape != lead:
        raise ValueError(f"{name}: targets shape {targets.shape} must equal the leading shape {lead}")
    if not jnp.issubdtype(targets.dtype, jnp.integer):
        raise ValueError(f"{name}: targets must be integer token ids, got dtype {targets.dtype}")


def _logprob_of(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """float32 log-softmax of `logits` [..., V] read at `targets` [...]."""
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return picked - lse


def token_logprobs_from_logits(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Plain version: log_softmax(logits)[..., targets] in float32. logits [B, T, V], targets [B, T] -> [B, T]."""
    _check_targets(targets, logits.shape[:-1], "token_logprobs_from_logits")
    return _logprob_of(logits, targets)


def token_logprobs(
    hidden: jax.Array, unembed: jax.Array, targets: jax.Array, *, chunk: int = 256
) -> jax.Array:
    """float32 log-probs of `targets` under logits = hidden @ unembed, never building [B, T, V] logits.

    Args:
      hidden: [B, T, D] final hidden states (after the final norm), any float dtype.
      unembed: [D, V] output projection (the LM head, or the transposed tied embedding).
      targets: [B, T] integer ids of the sampled / next tokens.
      chunk: tokens per chunk; the peak live logits block is [chunk, V] float32 (forward and backward).

    Returns:
      [B, T] float32 log π(targets | ·). Equal to `token_logprobs_from_logits(hidden @ unembed, targets)`.
    """
    if hidden.ndim != 3 or unembed.ndim != 2 or hidden.shape[-1] != unembed.shape[0]:
        raise ValueError(
            f"token_logprobs: expected hidden [B, T, D] and unembed [D, V] with matching D, "
            f"got {hidden.shape} and {unembed.shape}"
        )
    if chunk < 1:
        raise ValueError(f"token_logprobs: chunk must be >= 1, got {chunk}")
    batch, seq, dim = hidden.shape
    _check_targets(targets, (batch, seq), "token_logprobs")
    n = batch * seq
    chunk = min(chunk, n)
    pad = (-n) % chunk
    h = jnp.pad(hidden.reshape(n, dim), ((0, pad), (0, 0))).reshape(-1, chunk, dim)
    y = jnp.pad(targets.reshape(n), (0, pad)).reshape(-1, chunk)

    @jax.checkpoint
    def one_chunk(args: tuple[jax.Array, jax.Array]) -> jax.Array:
        h_c, y_c = args
        logits = jnp.einsum("CD,DV->CV", h_c, unembed, preferred_element_type=jnp.float32)
        return _logprob_of(logits, y_c)

    out = jax.lax.map(one_chunk, (h, y))
    return out.reshape(-1)[:n].reshape(batch, seq)
