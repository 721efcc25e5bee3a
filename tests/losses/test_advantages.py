"""group_advantages (RECIPE.md §2): hand-computed, masks, G = 1, invariances; with and without jit. And their
rebalancing across strata (stratum_balanced_advantages): by hand, the cap, and its invariants as properties."""

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.losses import group_advantages, stratum_balanced_advantages

_adv_jit = jax.jit(group_advantages, static_argnames=("normalize_std", "eps"))


class HandComputedTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_by_hand(self):
        rewards = jnp.array([[1.0, 0.0, 0.5, 0.5], [2.0, 2.0, 2.0, 2.0]])
        out = self.variant(group_advantages)(rewards)
        # group 0: mean 0.5, population std sqrt((0.25 + 0.25) / 4) = sqrt(0.125)
        std = np.sqrt(0.125)
        np.testing.assert_allclose(out[0], np.array([0.5, -0.5, 0.0, 0.0]) / (std + 1e-6), rtol=1e-6)
        np.testing.assert_array_equal(out[1], 0.0)  # equal rewards -> 0, not NaN

    @chex.variants(with_jit=True, without_jit=True)
    def test_no_std_ablation_and_mask(self):
        rewards = jnp.array([[1.0, 0.0, 7.0]])
        mask = jnp.array([[True, True, False]])
        fn = self.variant(lambda r, m: group_advantages(r, m, normalize_std=False))
        np.testing.assert_allclose(fn(rewards, mask)[0], [0.5, -0.5, 0.0], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_single_rollout_groups_and_empty_groups(self):
        out = self.variant(group_advantages)(jnp.array([[3.0], [-1.0]]), jnp.array([[True], [False]]))
        np.testing.assert_array_equal(out, [[0.0], [0.0]])


rewards_st = hnp.arrays(np.float32, (3, 5), elements=st.floats(-2, 2, width=32, allow_subnormal=False))
masks_st = hnp.arrays(bool, (3, 5))


@pytest.mark.parametrize("use_jit", [False, True])
@settings(max_examples=30, deadline=None)
@given(rewards=rewards_st, mask=masks_st, seed=st.integers(0, 1000), normalize=st.booleans())
def test_invariances(use_jit, rewards, mask, seed, normalize):
    fn = _adv_jit if use_jit else group_advantages
    out = np.asarray(fn(rewards, mask, normalize_std=normalize))
    chex.assert_tree_all_finite(out)
    assert np.all(out[~mask] == 0.0)
    for g in range(3):  # zero mean over the valid rollouts of each group
        if mask[g].any():
            assert abs(out[g][mask[g]].mean()) < 1e-4
    perm = np.random.default_rng(seed).permutation(5)
    np.testing.assert_allclose(fn(rewards[:, perm], mask[:, perm], normalize_std=normalize), out[:, perm],
                               rtol=1e-5, atol=1e-5)
    padded = fn(np.pad(rewards, ((0, 1), (0, 2)), constant_values=9.0), np.pad(mask, ((0, 1), (0, 2))),
                normalize_std=normalize)
    np.testing.assert_allclose(np.asarray(padded)[:3, :5], out, rtol=1e-6)
    # Shift invariance, and scale invariance when normalising (the std absorbs the scale). With the std
    # division, a group whose rewards spread by less than float32's resolution at R + 5 (e.g. 1e-5 vs 0) has
    # its O(1) advantages rebuilt from rounded inputs, so those groups are compared without it only.
    big = np.array([np.ptp(rewards[g][mask[g]]) > 0.1 if mask[g].any() else False for g in range(3)])
    keep = big if normalize else np.ones(3, bool)
    shifted = np.asarray(fn(rewards + 5.0, mask, normalize_std=normalize))
    np.testing.assert_allclose(shifted[keep], out[keep], atol=1e-4)
    if normalize:
        scaled = np.asarray(fn(rewards * 3.0, mask, normalize_std=True))
        np.testing.assert_allclose(scaled[big], out[big], rtol=1e-3, atol=1e-3)


def test_bad_shape_raises():
    with pytest.raises(ValueError, match=r"\[N, G\]"):
        group_advantages(jnp.zeros(4))
    with pytest.raises(ValueError, match="mask shape"):
        group_advantages(jnp.zeros((2, 2)), jnp.ones((2, 3), bool))


@pytest.mark.parametrize("value", [1.6456013, 6.6456013, -123.456, 1e6 / 3])
def test_equal_rewards_give_exactly_zero(value):
    # A float32 mean of equal values need not round back to the value; the advantage must still be 0.
    rewards = jnp.full((2, 5), value, jnp.float32)
    np.testing.assert_array_equal(group_advantages(rewards), 0.0)
    np.testing.assert_array_equal(_adv_jit(rewards), 0.0)


_bal_jit = jax.jit(stratum_balanced_advantages, static_argnames=("num_strata", "max_scale"))


class StratumBalanceTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_by_hand(self):
        # Three groups: two of stratum 0 (mass 2 + 2), one of stratum 1 (mass 1); M = 5, K+ = 2, target 2.5 each.
        adv = jnp.array([[1.0, -1.0], [0.5, -1.5], [0.5, -0.5]])
        fn = self.variant(lambda a, s: stratum_balanced_advantages(a, s, 3, max_scale=10.0))
        out, share, scale = fn(adv, jnp.array([0, 0, 1]))
        np.testing.assert_allclose(scale, [2.5 / 4, 2.5 / 1, 1.0], rtol=1e-6)  # stratum 2 is empty: scale 1
        np.testing.assert_allclose(share, [0.8, 0.2, 0.0], rtol=1e-6)
        np.testing.assert_allclose(out, adv * np.array([[0.625], [0.625], [2.5]]), rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_cap_and_no_signal(self):
        adv = jnp.array([[4.0, -4.0], [0.01, -0.01]])
        out, _, scale = self.variant(lambda a, s: stratum_balanced_advantages(a, s, 2, max_scale=3.0))(
            adv, jnp.array([0, 1]))
        np.testing.assert_allclose(scale[1], 3.0)  # uncapped it would be 8.01 / 2 / 0.02 ≈ 200
        np.testing.assert_allclose(out[1], [0.03, -0.03], rtol=1e-5)
        zero, share, scale = self.variant(lambda a, s: stratum_balanced_advantages(a, s, 2))(
            jnp.zeros((2, 3)), jnp.array([0, 1]))
        np.testing.assert_array_equal(zero, 0.0)
        np.testing.assert_array_equal(share, 0.0)
        np.testing.assert_array_equal(scale, 1.0)


@pytest.mark.parametrize("use_jit", [False, True])
@settings(max_examples=30, deadline=None)
@given(rewards=rewards_st, mask=masks_st, strata=hnp.arrays(np.int32, (3,), elements=st.integers(0, 2)))
def test_balanced_strata_carry_equal_mass(use_jit, rewards, mask, strata):
    """Uncapped: every stratum with signal ends with the same mass, the total is kept, each group is scaled by one
    positive constant (signs and zero means kept), padding stays 0; one stratum alone is the identity."""
    fn = _bal_jit if use_jit else stratum_balanced_advantages
    adv = np.asarray(group_advantages(rewards, mask, normalize_std=False))
    out, share, scale = (np.asarray(x) for x in fn(adv, strata, num_strata=3, mask=mask, max_scale=1e9))
    chex.assert_tree_all_finite(out)
    assert np.all(out[~mask] == 0.0) and np.all(scale > 0)
    mass = np.array([np.abs(adv[strata == k]).sum() for k in range(3)])
    after = np.array([np.abs(out[strata == k]).sum() for k in range(3)])
    live = mass > 0
    if live.any():
        np.testing.assert_allclose(after[live], mass.sum() / live.sum(), rtol=1e-4)
        np.testing.assert_allclose(share, mass / mass.sum(), rtol=1e-4, atol=1e-6)
    else:
        np.testing.assert_array_equal(share, 0.0)
    np.testing.assert_allclose(out, adv * scale[strata][:, None], rtol=1e-6)
    one, _, _ = fn(adv, np.zeros(3, np.int32), num_strata=3, mask=mask, max_scale=1e9)
    np.testing.assert_allclose(one, adv, rtol=1e-6)


def test_balance_bad_input_raises():
    with pytest.raises(ValueError, match=r"strata \[N\]"):
        stratum_balanced_advantages(jnp.zeros((2, 3)), jnp.zeros(3, jnp.int32), 2)
    with pytest.raises(ValueError, match="max_scale must be > 0"):
        stratum_balanced_advantages(jnp.zeros((2, 3)), jnp.zeros(2, jnp.int32), 2, max_scale=0.0)
