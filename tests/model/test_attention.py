"""Causal self-attention in query blocks equals one full block, values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.model.layers import attend, causal_self_attend


@pytest.mark.parametrize("t,block", [(10, 4), (12, 12), (9, 16), (5, 2)])
def test_blocked_causal_attention_matches_full(t, block):
    b, n, kv, h = 2, 4, 2, 8
    ks = jax.random.split(jax.random.key(t * 31 + block), 3)
    q = jax.random.normal(ks[0], (b, t, n, h))
    k = jax.random.normal(ks[1], (b, t, kv, h))
    v = jax.random.normal(ks[2], (b, t, kv, h))
    pos = jnp.broadcast_to(jnp.arange(t) + 3, (b, t))

    def full(q, k, v):
        return attend(q, k, v, pos, pos)

    def blocked(q, k, v):
        return causal_self_attend(q, k, v, pos, block=block)

    np.testing.assert_allclose(blocked(q, k, v), full(q, k, v), atol=1e-6)
    g_full, g_blk = (jax.grad(lambda *a, f=f: jnp.sum(jnp.sin(f(*a))), argnums=(0, 1, 2))(q, k, v)
                     for f in (full, blocked))
    jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, atol=1e-5), g_full, g_blk)


def test_attend_is_causal_and_groups_query_heads_per_kv_head():
    """Query head n reads kv head n // (N/K); a key at a later position is never seen."""
    b, t, n, kv, h = 1, 5, 4, 2, 3
    q = jnp.ones((b, t, n, h))
    k = jnp.zeros((b, t, kv, h))
    v = jnp.broadcast_to(jnp.arange(t, dtype=jnp.float32)[None, :, None, None], (b, t, kv, h))
    v = v * jnp.array([1.0, 10.0])[None, None, :, None]
    pos = jnp.arange(t)[None]
    out = attend(q, k, v, pos, pos)  # equal scores: the mean of the visible values
    expect = np.arange(t) / 2.0
    np.testing.assert_allclose(out[0, :, 0, 0], expect, atol=1e-6)
    np.testing.assert_allclose(out[0, :, 1, 0], expect, atol=1e-6)
    np.testing.assert_allclose(out[0, :, 2, 0], 10 * expect, atol=1e-5)
    np.testing.assert_allclose(out[0, :, 3, 0], 10 * expect, atol=1e-5)
