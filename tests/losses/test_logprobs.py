"""token_logprobs: chunked == plain == log_softmax, gradients too, and no [B, T, V] float32 buffer."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from searchjax.losses import token_logprobs, token_logprobs_from_logits


def _inputs(seed, b=2, t=7, d=16, v=50, dtype=jnp.float32):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    hidden = jax.random.normal(k1, (b, t, d)).astype(dtype)
    unembed = (jax.random.normal(k2, (v, d)) / 4).astype(dtype)
    targets = jax.random.randint(k3, (b, t), 0, v)
    return hidden, unembed, targets


class ChunkedTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_log_softmax_for_any_chunk(self):
        # V = 50 with divisor chunks and chunk > V; V = 97 (prime) is padded to a multiple of the chunk.
        for seed, v, chunk in ((0, 50, 1), (1, 50, 3), (2, 50, 7), (3, 50, 64), (4, 97, 16), (5, 97, 40)):
            hidden, unembed, targets = _inputs(seed, v=v)
            got = self.variant(lambda h, w, y: token_logprobs(h, w, y, chunk=chunk))(hidden, unembed, targets)
            logits = jnp.einsum("BTD,VD->BTV", hidden, unembed)
            want = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), targets[..., None], -1)[..., 0]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(self.variant(token_logprobs_from_logits)(logits, targets), want,
                                       rtol=1e-5, atol=1e-5)
            chex.assert_type(got, jnp.float32)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(50, 97)
    def test_gradients_match_plain(self, v):
        hidden, unembed, targets = _inputs(5, v=v)
        weights = jax.random.normal(jax.random.PRNGKey(9), targets.shape)

        def chunked(h, w):
            return (token_logprobs(h, w, targets, chunk=16) * weights).sum()

        def plain(h, w):
            return (token_logprobs_from_logits(jnp.einsum("BTD,VD->BTV", h, w), targets) * weights).sum()

        g_chunk = self.variant(jax.grad(chunked, argnums=(0, 1)))(hidden, unembed)
        g_plain = jax.grad(plain, argnums=(0, 1))(hidden, unembed)
        for a, b in zip(g_chunk, g_plain):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_bf16_inputs_give_float32(self):
        hidden, unembed, targets = _inputs(6, dtype=jnp.bfloat16)
        got = self.variant(lambda h, w, y: token_logprobs(h, w, y, chunk=4))(hidden, unembed, targets)
        chex.assert_type(got, jnp.float32)
        logits = jnp.einsum("BTD,VD->BTV", hidden, unembed, preferred_element_type=jnp.float32)
        np.testing.assert_allclose(got, token_logprobs_from_logits(logits, targets), rtol=1e-5, atol=1e-5)


def test_never_materialises_full_float32_logits():
    b, t, d, v, chunk = 2, 256, 32, 4096, 32
    hidden, unembed, targets = _inputs(0, b, t, d, v)
    full_bytes = b * t * v * 4

    def loss(h, w, fn):
        return fn(h, w).sum()

    chunked = lambda h, w: token_logprobs(h, w, targets, chunk=chunk)
    plain = lambda h, w: token_logprobs_from_logits(jnp.einsum("BTD,VD->BTV", h, w), targets)
    temps = {}
    for name, fn in (("chunked", chunked), ("plain", plain)):
        grad = jax.jit(jax.grad(lambda h, w: loss(h, w, fn), argnums=(0, 1)))
        temps[name] = grad.lower(hidden, unembed).compile().memory_analysis().temp_size_in_bytes
    assert temps["plain"] >= full_bytes  # the plain version does hold [B, T, V] float32
    assert temps["chunked"] < full_bytes / 4, temps


def test_bad_shapes_raise():
    hidden, unembed, targets = _inputs(0)
    with pytest.raises(ValueError, match="matching D"):
        token_logprobs(hidden, unembed.T, targets)
    with pytest.raises(ValueError, match="targets shape"):
        token_logprobs(hidden, unembed, targets[:, :3])
    with pytest.raises(ValueError, match="integer"):
        token_logprobs(hidden, unembed, targets.astype(jnp.float32))
    with pytest.raises(ValueError, match="chunk"):
        token_logprobs(hidden, unembed, targets, chunk=0)
