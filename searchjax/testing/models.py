"""Tiny model configs and inputs for tests and for other helpers' tests (no torch here).

`tiny_config(name)` gives a few small but structurally different Qwen3.5-MoE configs (layer patterns, GQA ratios,
value/key head ratios, tied embeddings, top-k), all well under 1M parameters, so parity and cache tests cover
more than one shape. `tiny_model(name, seed)` returns (cfg, params).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from searchjax.model import ModelConfig, init_params, load_preset

TINY_VARIANTS: dict[str, dict] = {
    # The `tiny` preset: 3 DeltaNet + 1 attention, 8 experts top-2.
    "tiny": {},
    # Alternating layers, 2 cycles, MHA-like attention (N == K), key heads == value heads, top-3 of 6 experts.
    "alt": dict(num_hidden_layers=4, layer_types=("linear_attention", "full_attention") * 2, num_attention_heads=2,
                num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2,
                num_experts=6, num_experts_per_tok=3, partial_rotary_factor=0.5, hidden_size=48),
    # Tied embeddings, GQA 4:1, value heads 3× key heads, full attention first.
    "tied": dict(num_hidden_layers=3, layer_types=("full_attention", "linear_attention", "linear_attention"),
                 num_attention_heads=4, num_key_value_heads=1, linear_num_key_heads=1, linear_num_value_heads=3,
                 tie_word_embeddings=True, num_experts=4, num_experts_per_tok=1),
}


def tiny_config(name: str = "tiny", **overrides) -> ModelConfig:
    """A tiny config by variant name (TINY_VARIANTS), with optional field overrides."""
    if name not in TINY_VARIANTS:
        raise KeyError(f"unknown tiny variant {name!r}; available: {sorted(TINY_VARIANTS)}")
    changes = {**TINY_VARIANTS[name], **overrides}
    return load_preset("tiny").replace(**changes)


def tiny_model(name: str = "tiny", seed: int = 0, dtype="float32", **overrides):
    """(cfg, params) of a tiny config with random weights."""
    cfg = tiny_config(name, **overrides)
    return cfg, init_params(cfg, jax.random.key(seed), dtype)


def random_tokens(seed: int, batch: int, seq: int, vocab: int) -> jax.Array:
    """Uniform random int32 tokens [batch, seq]."""
    return jax.random.randint(jax.random.key(seed), (batch, seq), 0, vocab, dtype=jnp.int32)
