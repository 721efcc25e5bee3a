"""Anchored tool and length penalties (RECIPE.md §4): hand-computed cases, edge cases, invariances, the draw."""

import math

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from searchjax.rewards import (
    draw_tool_baseline,
    efficiency_penalty,
    length_penalty,
    tool_penalty,
    unconditional_length_penalty,
    unconditional_tool_penalty,
)

COEF = dict(alpha_win=0.5, alpha_lose=2.0, beta_lose=0.3)


class HandComputedTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_tool_penalty_by_hand(self):
        calls = jnp.array([[1, 3, 5, 4]])
        failures = jnp.array([[0, 1, 0, 0]])  # c̃ = 1, 2, 5, 4
        correct = jnp.array([[1, 1, 0, 0]])
        fn = self.variant(lambda c, f, r, b: tool_penalty(c, f, r, baseline=b, **COEF))
        out = fn(calls, failures, correct, jnp.array([1.0]))
        p = lambda d: 1 - math.exp(-d)
        want = [0.5 * p(0), 0.5 * p(1), 2.0 * p(4) + 0.3, 2.0 * p(3) + 0.3]
        np.testing.assert_allclose(out[0], want, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_length_penalty_by_hand(self):
        lengths = jnp.array([[150.0, 100.0, 20.0, 300.0, 0.0]])
        ref = jnp.array([[100.0, 200.0, 120.0, 250.0, 80.0]])
        correct = jnp.array([[1, 1, 0, 1, 0]])
        pref = jnp.array([[0.9, 0.5, 0.9, 0.2, 0.7]])
        out = self.variant(length_penalty)(lengths, ref, correct, pref)
        b_win = (100 + 200) / 2  # shaping set Ŵ = {0, 1}
        b_lose = (120 + 250 + 80) / 3
        want = [
            1 - math.exp(-max(0, 150 / b_win - 1)),  # verbose winner: 0
            1 - math.exp(-max(0, 100 / b_win - 1)),  # short winner: 0
            1 - math.exp(-max(0, b_lose / 20 - 1)),  # too-short loser
            1.0,  # 300 > max ref 250: hard cap
            1.0,  # L_i = 0 loser: the decided limit
        ]
        np.testing.assert_allclose(out[0], want, rtol=1e-6)
        verbose = self.variant(length_penalty)(jnp.array([[200.0, 100.0]]), jnp.array([[100.0, 250.0]]),
                                               jnp.array([[1, 1]]), jnp.array([[1.0, 1.0]]))
        np.testing.assert_allclose(verbose[0], [1 - math.exp(-(200 / 175 - 1)), 0.0], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_fixed_max_length_cap(self):
        fn = self.variant(lambda l, r, c, s: length_penalty(l, r, c, s, max_length=50))
        out = fn(jnp.array([[60.0, 40.0]]), jnp.array([[100.0, 100.0]]), jnp.array([[1, 1]]), jnp.array([[1.0, 1.0]]))
        np.testing.assert_allclose(out[0], [1.0, 0.0], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_efficiency_and_unconditional(self):
        pen = self.variant(lambda a, b: efficiency_penalty(a, b, lambda_tool=0.2, lambda_len=0.5))(
            jnp.array([[1.0, 0.0]]), jnp.array([[0.5, 1.0]]))
        np.testing.assert_allclose(pen[0], [0.45, 0.5], rtol=1e-6)
        tool = self.variant(lambda c, f: unconditional_tool_penalty(c, f, per_call=0.1))(
            jnp.array([[3, 1]]), jnp.array([[1, 0]]))
        np.testing.assert_allclose(tool[0], [0.2, 0.1], rtol=1e-6)
        length = self.variant(lambda l: unconditional_length_penalty(l, per_token=0.01))(jnp.array([[10, 0]]))
        np.testing.assert_allclose(length[0], [0.1, 0.0], rtol=1e-6)


class EdgeCaseTest(chex.TestCase):
    """RECIPE.md §4 decisions: empty winner set, all winners, L_i = 0, padded rows, G = 1."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_empty_winner_set_gives_beta_only(self):
        fn = self.variant(lambda c, f, r, k: tool_penalty(c, f, r, key=k, **COEF))
        out = fn(jnp.array([[0, 7, 2]]), jnp.zeros((1, 3), int), jnp.zeros((1, 3), int), jax.random.PRNGKey(0))
        np.testing.assert_allclose(out[0], [0.3, 0.3, 0.3], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_all_winners_no_beta(self):
        fn = self.variant(lambda c, f, r, k: tool_penalty(c, f, r, key=k, **COEF))
        out = fn(jnp.array([[2, 2, 2]]), jnp.zeros((1, 3), int), jnp.ones((1, 3), int), jax.random.PRNGKey(1))
        np.testing.assert_allclose(out[0], [0.0, 0.0, 0.0], atol=1e-7)  # b_g = 2 exactly

    @chex.variants(with_jit=True, without_jit=True)
    def test_padded_rows_and_single_rollout_groups_are_finite(self):
        mask = jnp.array([[True], [False]])
        tool = self.variant(lambda c, k: tool_penalty(c, c * 0, c * 0 + 1, key=k, mask=mask, **COEF))(
            jnp.array([[3], [9]]), jax.random.PRNGKey(0))
        length = self.variant(lambda l: length_penalty(l, l * 0, l * 0, l * 0, mask=mask))(jnp.array([[0.0], [0.0]]))
        chex.assert_tree_all_finite((tool, length))
        np.testing.assert_allclose(tool, [[0.0], [0.0]], atol=1e-7)
        np.testing.assert_allclose(length, [[1.0], [0.0]])  # valid L=0 loser -> 1; padded -> 0

    @chex.variants(with_jit=True, without_jit=True)
    def test_zero_reference_lengths_are_finite(self):
        out = self.variant(length_penalty)(jnp.array([[0.0, 5.0, 0.0]]), jnp.zeros((1, 3)),
                                           jnp.array([[1, 1, 0]]), jnp.ones((1, 3)))
        chex.assert_tree_all_finite(out)
        np.testing.assert_allclose(out[0], [0.0, 1.0, 1.0])


def test_bad_shapes_and_missing_key_raise():
    with pytest.raises(ValueError, match="key"):
        tool_penalty(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.zeros((1, 2)), **COEF)
    with pytest.raises(ValueError, match=r"\[N, G\]"):
        length_penalty(jnp.zeros((1, 2)), jnp.zeros((1, 3)), jnp.zeros((1, 2)), jnp.zeros((1, 2)))
    with pytest.raises(ValueError, match="baseline"):
        tool_penalty(jnp.zeros((2, 2)), jnp.zeros((2, 2)), jnp.zeros((2, 2)), baseline=jnp.zeros(3), **COEF)


def _groups(draw, n=3, g=5):
    ints = lambda hi: hnp.arrays(np.int32, (n, g), elements=st.integers(0, hi))
    calls = draw(ints(8))
    failures = np.minimum(draw(ints(3)), calls)
    correct = draw(hnp.arrays(np.int32, (n, g), elements=st.integers(0, 1)))
    pref = draw(hnp.arrays(np.float32, (n, g), elements=st.floats(0, 1, width=32, allow_subnormal=False)))
    lengths = draw(ints(400)).astype(np.float32)
    ref = draw(ints(400)).astype(np.float32)
    mask = draw(hnp.arrays(bool, (n, g)))
    return calls, failures, correct, pref, lengths, ref, mask


_tool_jit = jax.jit(lambda c, f, r, m, k: tool_penalty(c, f, r, key=k, mask=m, **COEF))
_len_jit = jax.jit(lambda l, r, c, s, m: length_penalty(l, r, c, s, mask=m))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), perm_seed=st.integers(0, 2**16))
def test_permuting_a_group_permutes_the_penalties(data, perm_seed):
    calls, failures, correct, pref, lengths, ref, mask = _groups(data.draw)
    perm = np.random.default_rng(perm_seed).permutation(calls.shape[1])
    key = jax.random.PRNGKey(perm_seed)
    tool = _tool_jit(calls, failures, correct, mask, key)
    tool_p = _tool_jit(calls[:, perm], failures[:, perm], correct[:, perm], mask[:, perm], key)
    np.testing.assert_allclose(tool_p, np.asarray(tool)[:, perm], rtol=1e-6)
    length = _len_jit(lengths, ref, correct, pref, mask)
    length_p = _len_jit(lengths[:, perm], ref[:, perm], correct[:, perm], pref[:, perm], mask[:, perm])
    np.testing.assert_allclose(length_p, np.asarray(length)[:, perm], rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_padding_does_not_change_valid_outputs(data, seed):
    calls, failures, correct, pref, lengths, ref, mask = _groups(data.draw, n=3, g=4)
    pad = lambda x, fill: np.concatenate([x, np.full((x.shape[0], 3), fill, x.dtype)], axis=1)
    key = jax.random.PRNGKey(seed)
    tool = tool_penalty(calls, failures, correct, key=key, mask=mask, **COEF)
    tool_pad = tool_penalty(pad(calls, 99), pad(failures, 0), pad(correct, 1), key=key,
                            mask=pad(mask, False), **COEF)
    np.testing.assert_allclose(tool_pad[:, :4], tool, rtol=1e-6)
    np.testing.assert_array_equal(tool_pad[:, 4:], 0.0)
    length = length_penalty(lengths, ref, correct, pref, mask=mask)
    length_pad = length_penalty(pad(lengths, 7.0), pad(ref, 1e4), pad(correct, 1), pad(pref, 1.0),
                                mask=pad(mask, False))
    np.testing.assert_allclose(length_pad[:, :4], length, rtol=1e-6)
    chex.assert_tree_all_finite((tool_pad, length_pad))
    assert np.all((np.asarray(length) >= 0) & (np.asarray(length) <= 1))


@settings(max_examples=20, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_drawn_baseline_is_an_integer_in_the_closed_range(data, seed):
    calls, failures, correct, _, _, _, mask = _groups(data.draw, n=6, g=5)
    eff = (calls - failures).astype(np.float32)
    win = (correct > 0) & mask
    b = np.asarray(jax.jit(draw_tool_baseline)(eff, win, jax.random.PRNGKey(seed)))
    for g in range(eff.shape[0]):
        if win[g].any():
            lo, hi = eff[g][win[g]].min(), math.ceil(eff[g][win[g]].mean())
            assert lo <= b[g] <= hi and b[g] == int(b[g])
        else:
            assert b[g] == 0.0


def test_drawn_baseline_is_uniform_chi_square():
    # One group, winners with c̃ = 1, 2, 6, 6 -> range [1, ceil(15/4) = 4]: four equally likely integers.
    eff = jnp.array([[1.0, 2.0, 6.0, 6.0, 9.0]])
    win = jnp.array([[True, True, True, True, False]])
    keys = jax.random.split(jax.random.PRNGKey(0), 4000)
    draws = np.asarray(jax.jit(jax.vmap(lambda k: draw_tool_baseline(eff, win, k)))(keys))[:, 0]
    counts = np.array([(draws == v).sum() for v in (1, 2, 3, 4)])
    assert counts.sum() == len(draws)
    assert stats.chisquare(counts).pvalue > 1e-3, counts
    continuous = np.asarray(jax.vmap(lambda k: draw_tool_baseline(eff, win, k, continuous=True))(keys))[:, 0]
    assert continuous.min() >= 1.0 and continuous.max() <= 4.0
    assert stats.kstest((continuous - 1.0) / 3.0, "uniform").pvalue > 1e-3
