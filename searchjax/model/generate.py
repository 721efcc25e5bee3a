"""Batched greedy decoding with the cache (used by the demo and as a simple reference generator)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from searchjax.model.cache import init_cache
from searchjax.model.config import ModelConfig
from searchjax.model.params import Params
from searchjax.model.transformer import decode_step, prefill


def greedy_generate(params: Params, cfg: ModelConfig, prompts: jax.Array, lengths: jax.Array, max_new_tokens: int,
                    cache_dtype=None) -> jax.Array:
    """Greedy continuation of right-padded prompts [B,T] (lengths[b] valid): int32 [B, max_new_tokens].

    token_0 = argmax logits at the last prompt token (from one prefill), then token_{i+1} = argmax decode_step(
    token_i). Rows do not stop at EOS (callers cut at their stop tokens).
    """
    b, t = prompts.shape
    if max_new_tokens < 1:
        raise ValueError(f"greedy_generate: max_new_tokens must be >= 1, got {max_new_tokens}")
    lengths = jnp.asarray(lengths, jnp.int32)
    dtype = cache_dtype or params.embed.dtype
    cache = init_cache(cfg, b, t + max_new_tokens, dtype)
    logits, cache = prefill(params, prompts, cfg, cache, lengths)
    token = jnp.argmax(logits[jnp.arange(b), lengths - 1], axis=-1).astype(jnp.int32)
    out = [token]
    for _ in range(max_new_tokens - 1):
        logits, cache = decode_step(params, token, cfg, cache)
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        out.append(token)
    return jnp.stack(out, axis=1)
