"""Properties of the sampling distribution μ (temperature, top-k, top-p) and of the recorded log μ."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from searchjax.rollout.sampling import Sampling, SamplingArrays, sample, sampling_logprobs, token_logprobs

V = 32


def _logits(seed, rows=3):
    return jax.random.normal(jax.random.key(seed), (rows, V)) * 3.0


class TestSamplingLogprobs(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_plain_temperature_is_scaled_log_softmax(self):
        logits = _logits(0)
        params = SamplingArrays.of([Sampling(0.7), Sampling(1.0), Sampling(1.5)])
        got = self.variant(sampling_logprobs)(logits, params)
        want = jax.nn.log_softmax(logits / params.temperature[:, None], axis=-1)
        np.testing.assert_allclose(got, want, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_greedy_is_a_point_mass_on_argmax(self):
        logits = _logits(1)
        logp = self.variant(sampling_logprobs)(logits, SamplingArrays.of([Sampling(0.0)] * 3))
        np.testing.assert_array_equal(jnp.argmax(logp, -1), jnp.argmax(logits, -1))
        np.testing.assert_array_equal(jnp.max(logp, -1), 0.0)
        assert int(jnp.sum(jnp.isfinite(logp))) == 3


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    temperature=st.floats(0.2, 2.0),
    top_p=st.floats(0.05, 1.0),
    top_k=st.integers(0, V + 4),
)
@example(seed=0, temperature=0.5, top_p=1.0, top_k=0)  # float32 rounding of 1 − tail to 1.0 (found by hypothesis)
def test_truncated_distribution_properties(seed, temperature, top_p, top_k):
    logits = _logits(seed, rows=2)
    params = SamplingArrays.of([Sampling(temperature, top_p, top_k)] * 2)
    logp = sampling_logprobs(logits, params)
    # A distribution: sums to one over the kept set.
    np.testing.assert_allclose(jax.scipy.special.logsumexp(logp, axis=-1), 0.0, atol=1e-5)
    kept = np.isfinite(np.asarray(logp))
    z = np.asarray(logits) / temperature
    for row in range(2):
        order = np.argsort(-z[row])
        n = kept[row].sum()
        # The kept set is a top slice of the ranking (random logits: no ties).
        assert kept[row][order[:n]].all() and not kept[row][order[n:]].any()
        if top_k:
            assert n <= top_k
        # Top-p minimality: without its last token the kept set's mass (within top-k) is below p. The reference
        # masses are float64 (in float32 a tail of ~1e-11 rounds 1 − tail to 1.0 = top_p); 1e-6 allows for the
        # float32 cumulative sum of the implementation at the boundary.
        k = min(top_k, V) if top_k else V
        zk = z[row][order[:k]].astype(np.float64)
        p = np.exp(zk - zk.max())
        p /= p.sum()
        assert n == 1 or p[: n - 1].sum() < top_p + 1e-6
        assert p[:n].sum() >= top_p - 1e-5 or n == k


def test_samples_come_from_the_kept_set_and_logprob_matches():
    logits = _logits(3, rows=4)
    params = SamplingArrays.of([Sampling(1.0, 0.5, 0), Sampling(0.8, 1.0, 3), Sampling(0.0), Sampling(1.2, 0.9, 5)])
    keys = jax.random.split(jax.random.key(7), 4)
    tokens, logp = jax.jit(sample)(keys, logits, params)
    full = sampling_logprobs(logits, params)
    assert np.isfinite(np.asarray(logp)).all()
    np.testing.assert_allclose(logp, full[jnp.arange(4), tokens], atol=0)
    np.testing.assert_allclose(token_logprobs(logits, tokens, params), logp, atol=1e-6)


def test_sampling_frequencies_follow_mu():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
    params = SamplingArrays.of([Sampling(1.0, 0.9, 0)])  # keeps the first three: mass 0.95 >= 0.9
    keys = jax.random.split(jax.random.key(0), 20_000)
    draw = jax.jit(jax.vmap(lambda k: sample(k[None], logits, params)[0][0]))(keys)
    freq = np.bincount(np.asarray(draw), minlength=4) / 20_000
    np.testing.assert_allclose(freq, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0], atol=0.015)


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2)])
def test_bad_settings_are_rejected(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        Sampling(**bad)
