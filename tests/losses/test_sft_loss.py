"""SFT loss: masked token-mean cross entropy over assistant tokens (RECIPE.md §1)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from searchjax.losses import sft_loss, sft_loss_from_logprobs, token_logprobs_from_logits


class SftTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_by_hand(self):
        logp = jnp.log(jnp.array([[0.5, 0.25, 0.1], [0.2, 0.9, 0.9]]))
        mask = jnp.array([[1, 1, 0], [0, 1, 0]], bool)  # tool output / prompt tokens are masked out
        loss, metrics = self.variant(sft_loss_from_logprobs)(logp, mask)
        want = -(np.log(0.5) + np.log(0.25) + np.log(0.9)) / 3
        np.testing.assert_allclose(loss, want, rtol=1e-6)
        np.testing.assert_allclose(metrics["ppl"], np.exp(want), rtol=1e-6)
        np.testing.assert_allclose(metrics["n_tokens"], 3.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_empty_mask_is_zero_and_masked_tokens_get_no_gradient(self):
        logp = jnp.full((2, 3), -1.0)
        loss, _ = self.variant(sft_loss_from_logprobs)(logp, jnp.zeros((2, 3), bool))
        np.testing.assert_array_equal(loss, 0.0)
        mask = jnp.array([[1, 0, 0], [0, 0, 1]], bool)
        grad = jax.grad(lambda x: sft_loss_from_logprobs(x, mask)[0])(logp)
        np.testing.assert_allclose(grad, np.where(mask, -0.5, 0.0))

    @chex.variants(with_jit=True, without_jit=True)
    def test_from_hidden_matches_plain_cross_entropy(self):
        k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
        hidden = jax.random.normal(k1, (2, 5, 8))
        unembed = jax.random.normal(k2, (30, 8))
        targets = jax.random.randint(k3, (2, 5), 0, 30)
        mask = jnp.array([[0, 1, 1, 1, 0], [1, 1, 0, 0, 0]], bool)
        loss, _ = self.variant(lambda h, w: sft_loss(h, w, targets, mask, chunk=3))(hidden, unembed)
        logp = token_logprobs_from_logits(hidden @ unembed.T, targets)
        np.testing.assert_allclose(loss, -np.asarray(logp)[np.asarray(mask)].mean(), rtol=1e-5)
