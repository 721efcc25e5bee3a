"""Bradley–Terry (RECIPE.md §4): symmetric loss, order-averaged preference, both scorer conventions."""

import math

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.rewards import bt_loss, bt_preference, pairwise_deltas, pointwise_deltas

floats = hnp.arrays(np.float32, (7,), elements=st.floats(-30, 30, width=32, allow_subnormal=False))
labels = hnp.arrays(np.float32, (7,), elements=st.sampled_from([0.0, 1.0]))
_loss_jit = jax.jit(bt_loss)
_pref_jit = jax.jit(bt_preference)


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


class HandComputedTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_loss_by_hand(self):
        # Pairwise head with position bias: Δ(a, b) = 1.0, Δ(b, a) = 0.5 (not −1.0), label r = 1.
        loss = self.variant(bt_loss)(jnp.array([1.0]), jnp.array([0.5]), jnp.array([1.0]))
        want = 0.5 * -math.log(sigmoid(1.0)) + 0.5 * -math.log(1 - sigmoid(0.5))
        np.testing.assert_allclose(loss, want, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_preference_by_hand(self):
        pref = self.variant(bt_preference)(jnp.array([1.0, 0.0]), jnp.array([0.5, 0.0]))
        np.testing.assert_allclose(pref, [sigmoid(0.25), 0.5], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_mask_averages_valid_pairs(self):
        fn = self.variant(bt_loss)
        full = fn(jnp.array([2.0, -1.0, 9.0]), jnp.array([-2.0, 1.0, 3.0]), jnp.array([1.0, 0.0, 1.0]),
                  jnp.array([True, True, False]))
        first_two = fn(jnp.array([2.0, -1.0]), jnp.array([-2.0, 1.0]), jnp.array([1.0, 0.0]))
        np.testing.assert_allclose(full, first_two, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_extreme_logits_are_finite(self):
        loss = self.variant(bt_loss)(jnp.array([500.0, -500.0]), jnp.array([-500.0, 500.0]), jnp.array([0.0, 1.0]))
        chex.assert_tree_all_finite(loss)
        np.testing.assert_allclose(loss, 500.0, rtol=1e-6)


@pytest.mark.parametrize("use_jit", [False, True])
@settings(max_examples=40, deadline=None)
@given(d_ab=floats, d_ba=floats, r=labels)
def test_swapping_pair_and_flipping_label_leaves_loss_unchanged(use_jit, d_ab, d_ba, r):
    fn = _loss_jit if use_jit else bt_loss
    np.testing.assert_allclose(fn(d_ab, d_ba, r), fn(d_ba, d_ab, 1 - r), rtol=1e-6)


@pytest.mark.parametrize("use_jit", [False, True])
@settings(max_examples=40, deadline=None)
@given(d_ab=floats, d_ba=floats)
def test_preference_is_antisymmetric_under_order_swap(use_jit, d_ab, d_ba):
    fn = _pref_jit if use_jit else bt_preference
    p = np.asarray(fn(d_ab, d_ba))
    np.testing.assert_allclose(p, 1 - np.asarray(fn(d_ba, d_ab)), atol=1e-6)
    assert np.all((p >= 0) & (p <= 1))


@settings(max_examples=40, deadline=None)
@given(s_a=floats, s_b=floats, r=labels)
def test_pointwise_convention_reduces_to_plain_bradley_terry(s_a, s_b, r):
    d_ab, d_ba = pointwise_deltas(s_a, s_b)
    np.testing.assert_allclose(d_ba, -d_ab)
    # With Δ(b, a) = −Δ(a, b) both halves of L_sym equal ℓ_BT(Δ, r) and P̄ = σ(s_a − s_b).
    delta = s_a.astype(np.float64) - s_b
    plain = np.mean(-(r * np.log(1 / (1 + np.exp(-delta))) + (1 - r) * np.log(1 / (1 + np.exp(delta)))))
    np.testing.assert_allclose(bt_loss(d_ab, d_ba, r), plain, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bt_preference(d_ab, d_ba), 1 / (1 + np.exp(-delta)), atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(l_ab=floats, l_ba=floats, r=labels)
def test_pairwise_convention_keeps_both_orders(l_ab, l_ba, r):
    d_ab, d_ba = pairwise_deltas(l_ab, l_ba)
    np.testing.assert_array_equal(d_ab, l_ab)
    np.testing.assert_array_equal(d_ba, l_ba)
    # A position bias added to both orders cancels in the permutation average.
    np.testing.assert_allclose(bt_preference(d_ab + 3.0, d_ba + 3.0), bt_preference(d_ab, d_ba), atol=1e-5)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="shapes must match"):
        bt_loss(jnp.zeros(3), jnp.zeros(2), jnp.zeros(3))


def test_consensus_filter_by_hand():
    from searchjax.rewards import consensus_labels

    votes = jnp.array([[1, 1, 1], [0, 0, 0], [1, 1, 0], [1, 0, 0], [1, 0, 1]])
    valid = jnp.array([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]], bool)
    label, keep = consensus_labels(votes, valid)
    np.testing.assert_array_equal(label, [1.0, 0.0, 1.0, 0.0, 0.5])
    np.testing.assert_array_equal(keep, [True, True, False, False, False])  # unanimous only; a tie never
    _, keep_majority = jax.jit(lambda v, m: consensus_labels(v, m, min_agreement=2 / 3))(votes, valid)
    np.testing.assert_array_equal(keep_majority, [True, True, True, True, False])
    loss = bt_loss(jnp.zeros(5), jnp.zeros(5), label, keep)  # the keep mask feeds bt_loss directly
    np.testing.assert_allclose(loss, np.log(2), rtol=1e-6)
    with pytest.raises(ValueError, match="min_agreement"):
        consensus_labels(votes, min_agreement=0.5)
