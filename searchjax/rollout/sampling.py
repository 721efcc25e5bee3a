"""Token sampling with temperature, top-k and top-p, and the log-probability μ_infer of what was sampled.

Token-level importance sampling (RECIPE.md §2) divides by μ_infer(o_t), the probability the inference engine
gave the token it actually sampled. That is the probability under the distribution sampled *from*, i.e. after
temperature and truncation, not the raw softmax:

    z = logits / T                                                  (temperature T > 0)
    K = {v : z_v ≥ z_(k)}                                           (top-k; all of V when k = 0)
    P = smallest prefix of K sorted by z (descending) whose softmax mass over K reaches p  (top-p)
    μ(v) = exp(z_v) / Σ_{u∈P} exp(z_u)  for v ∈ P,  0 otherwise
    log μ(o_t) is recorded for the sampled o_t ~ μ.

T = 0 means greedy decoding: μ is the point mass on argmax(logits), so log μ(o_t) = 0. Ties at a threshold
keep every tied token (deterministically), so a recomputation from the same logits gives the same set.
All functions are pure, batched over rows with per-row parameters, and jit-able.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

NEG_INF = -jnp.inf


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Per-request sampling settings: temperature (0 = greedy), top_p in (0, 1], top_k (0 = off)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        if not self.temperature >= 0.0:
            raise ValueError(f"Sampling.temperature must be >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"Sampling.top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"Sampling.top_k must be an int >= 0 (0 = off), got {self.top_k!r}")


@struct.dataclass
class SamplingArrays:
    """Sampling settings as arrays over rows: temperature[B] f32, top_p[B] f32, top_k[B] i32."""

    temperature: jax.Array
    top_p: jax.Array
    top_k: jax.Array

    @classmethod
    def of(cls, settings: Sampling | list[Sampling] | tuple[Sampling, ...]) -> "SamplingArrays":
        """Arrays for one Sampling (shape [1]) or a sequence of them (shape [B])."""
        rows = [settings] if isinstance(settings, Sampling) else list(settings)
        return cls(
            temperature=jnp.asarray([s.temperature for s in rows], jnp.float32),
            top_p=jnp.asarray([s.top_p for s in rows], jnp.float32),
            top_k=jnp.asarray([s.top_k for s in rows], jnp.int32),
        )


def _truncation_threshold(z: jax.Array, top_p: jax.Array, top_k: jax.Array) -> jax.Array:
    """Per row, the smallest scaled logit kept by top-k then top-p (z[B,V], top_p[B], top_k[B]) -> [B]."""
    vocab = z.shape[-1]
    desc = -jnp.sort(-z, axis=-1)  # [B,V] descending
    rank = jnp.arange(vocab)[None, :]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)[:, None]
    desc = jnp.where(rank < k, desc, NEG_INF)
    probs = jax.nn.softmax(desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    # The first token is always kept; a later one while the mass before it is still short of p (top_p = 1 is
    # "off": rounding in the cumulative sum must not drop the far tail).
    p = top_p[:, None]
    keep = (rank < k) & ((mass_before < p) | (p >= 1.0) | (rank == 0))
    count = jnp.sum(keep, axis=-1)
    return jnp.take_along_axis(desc, (count - 1)[:, None], axis=-1)[:, 0]


def sampling_logprobs(logits: jax.Array, params: SamplingArrays) -> jax.Array:
    """log μ over the vocabulary (logits[B,V] -> [B,V] f32, −inf outside the kept set); see module docstring."""
    logits = logits.astype(jnp.float32)
    greedy = params.temperature <= 0.0
    safe_t = jnp.where(greedy, 1.0, params.temperature)
    z = logits / safe_t[:, None]
    threshold = _truncation_threshold(z, params.top_p, params.top_k)
    kept = jnp.where(z >= threshold[:, None], z, NEG_INF)
    sampled = jax.nn.log_softmax(kept, axis=-1)
    point = jnp.where(jnp.arange(logits.shape[-1])[None, :] == jnp.argmax(logits, axis=-1)[:, None], 0.0, NEG_INF)
    return jnp.where(greedy[:, None], point, sampled)


def sample(keys: jax.Array, logits: jax.Array, params: SamplingArrays) -> tuple[jax.Array, jax.Array]:
    """Draw one token per row and return (tokens[B] i32, log μ(tokens)[B] f32).

    keys: [B] typed PRNG keys, one independent stream per row (so a row's draw does not depend on the others).
    """
    logp = sampling_logprobs(logits, params)
    tokens = jax.vmap(lambda k, lp: jax.random.categorical(k, lp))(keys, logp).astype(jnp.int32)
    token_logp = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    return tokens, token_logp


def token_logprobs(logits: jax.Array, tokens: jax.Array, params: SamplingArrays) -> jax.Array:
    """log μ(tokens) for given tokens under the sampling distribution (logits[B,V], tokens[B]) -> [B]."""
    logp = sampling_logprobs(logits, params)
    return jnp.take_along_axis(logp, tokens[:, None].astype(jnp.int32), axis=-1)[:, 0]
