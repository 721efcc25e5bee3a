"""Log-probabilities of sampled tokens, in float32, with and without materialising the logits.

For Qwen3.5 the vocabulary is V = 248,320: full float32 logits for B·T = 2,048 tokens already take 2 GB, and
their gradient as much again. `token_logprobs` therefore scans over vocabulary chunks W_c (rows of the [V, D]
unembedding) with an online log-sum-exp:

    m ← max(m, max_v h·W_c[v]),   s ← s·exp(m_old − m) + Σ_v exp(h·W_c[v] − m)
    log π(y | ·) = h·W[y] − (m + log s)

The scan body is rematerialised (`jax.checkpoint`) on the backward pass, so only a [B·T, chunk] float32 block
is ever alive, and the unembedding gradient comes out chunk by chunk as the scan's stacked output (a free
reshape to [V, D], no [V, D] accumulator besides the gradient itself).
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


def _vocab_chunk(vocab: int, chunk: int) -> tuple[int, int]:
    """(chunk size, padding rows): the largest divisor of V that is <= chunk (no padded copy of W), unless
    that divisor is under chunk/4 (an awkward V), then `chunk` itself with V padded up to a multiple."""
    size = min(chunk, vocab)
    divisor = next(c for c in range(size, 0, -1) if vocab % c == 0)
    if 4 * divisor >= size:
        return divisor, 0
    return size, (-vocab) % size


def token_logprobs(
    hidden: jax.Array, unembed: jax.Array, targets: jax.Array, *, chunk: int = 4096
) -> jax.Array:
    """float32 log-probs of `targets` under logits = hidden @ unembedᵀ, never building [B, T, V] logits.

    Args:
      hidden: [B, T, D] final hidden states (after the final norm), any float dtype.
      unembed: [V, D] unembedding (`Params.unembed`: HF lm_head.weight, or the tied embedding).
      targets: [B, T] integer ids of the sampled / next tokens, in [0, V): an id outside that range matches no
        vocabulary row and gives −logsumexp instead of an error (values cannot be checked under jit).
      chunk: vocabulary rows per scan step (adjusted to a divisor of V when one is close); the peak live
        logits block is [B·T, chunk] float32, forward and backward.

    Returns:
      [B, T] float32 log π(targets | ·). Equal to `token_logprobs_from_logits(hidden @ unembedᵀ, targets)`.
    """
    if hidden.ndim != 3 or unembed.ndim != 2 or hidden.shape[-1] != unembed.shape[1]:
        raise ValueError(
            f"token_logprobs: expected hidden [B, T, D] and unembed [V, D] with matching D, "
            f"got {hidden.shape} and {unembed.shape}"
        )
    if chunk < 1:
        raise ValueError(f"token_logprobs: chunk must be >= 1, got {chunk}")
    batch, seq, dim = hidden.shape
    _check_targets(targets, (batch, seq), "token_logprobs")
    vocab = unembed.shape[0]
    size, pad = _vocab_chunk(vocab, chunk)
    w = jnp.pad(unembed, ((0, pad), (0, 0))) if pad else unembed
    w = w.reshape(-1, size, dim)
    starts = jnp.arange(w.shape[0], dtype=jnp.int32) * size
    h = hidden.reshape(batch * seq, dim)
    y = targets.reshape(batch * seq).astype(jnp.int32)

    @jax.checkpoint
    def step(carry, xs):
        m, s, picked = carry
        w_c, start = xs
        logits = jnp.einsum("ND,CD->NC", h, w_c, preferred_element_type=jnp.float32)
        if pad:
            logits = jnp.where(start + jnp.arange(size) < vocab, logits, -jnp.inf)
        m_new = jnp.maximum(m, logits.max(axis=-1))
        s = s * jnp.exp(m - m_new) + jnp.exp(logits - m_new[:, None]).sum(axis=-1)
        local = y - start
        inside = (local >= 0) & (local < size)
        here = jnp.take_along_axis(logits, jnp.clip(local, 0, size - 1)[:, None], axis=-1)[:, 0]
        return (m_new, s, picked + jnp.where(inside, here, 0.0)), None

    n = batch * seq
    init = (jnp.full((n,), jnp.finfo(jnp.float32).min), jnp.zeros((n,)), jnp.zeros((n,)))
    (m, s, picked), _ = jax.lax.scan(step, init, (w, starts))
    return (picked - (m + jnp.log(s))).reshape(batch, seq)
