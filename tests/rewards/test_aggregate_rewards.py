"""Gated aggregation and compute_rewards (RECIPE.md §4) against the per-rollout Python reference."""

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.config import configs_dir, load_yaml
from searchjax.rewards import (
    RewardBreakdown,
    RewardConfig,
    RolloutRecords,
    calls_covariance,
    compute_rewards,
    gated_reward,
    group_covariance,
    linear_reward,
    reward_metrics,
    reward_terms,
)
from searchjax.rewards.reference import draw_baselines_python, reference_rewards

N, G = 4, 6
_compute = jax.jit(compute_rewards, static_argnames="cfg")


@st.composite
def records(draw, n=N, g=G):
    ints = lambda hi: draw(hnp.arrays(np.int32, (n, g), elements=st.integers(0, hi)))
    calls = ints(7)
    return RolloutRecords(
        correct=draw(hnp.arrays(np.float32, (n, g), elements=st.sampled_from([0.0, 1.0]))),
        preference=draw(hnp.arrays(np.float32, (n, g), elements=st.floats(0, 1, width=32, allow_subnormal=False))),
        calls=calls,
        failures=np.minimum(ints(2), calls),
        lengths=ints(300).astype(np.float32),
        ref_lengths=ints(300).astype(np.float32),
        mask=draw(hnp.arrays(bool, (n, g))),
    )


def _as_lists(batch: RolloutRecords) -> dict:
    return {k: np.asarray(getattr(batch, k)).tolist() for k in batch.__dataclass_fields__}


CONFIGS = [
    RewardConfig(),
    RewardConfig(alpha_win=0.3, alpha_lose=1.5, beta_lose=0.2, lambda_tool=0.4, lambda_len=0.7,
                 normalize_std=False, aggregation="linear", linear_weight=0.5, max_length=250),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["default", "ablations"])
@settings(max_examples=30, deadline=None)
@given(batch=records(), seed=st.integers(0, 2**31 - 1))
def test_matches_per_rollout_reference(cfg, batch, seed):
    out = _compute(batch, cfg, jax.random.PRNGKey(seed))
    ref = reference_rewards(_as_lists(batch), np.asarray(out.tool_baseline).tolist(), cfg)
    for name in ("tool_penalty", "length_penalty", "efficiency_penalty", "reward"):
        np.testing.assert_allclose(getattr(out, name), ref[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # Advantages divide by the group std: where it is tiny, float32 rounding of R is amplified, so compare the
    # groups whose valid rewards spread by more than 1e-2 (group_advantages has its own exact tests).
    mask = np.asarray(batch.mask)
    spread = np.array([np.ptp(np.asarray(ref["reward"])[g][mask[g]]) if mask[g].any() else 0.0 for g in range(N)])
    keep = spread > 1e-2
    np.testing.assert_allclose(np.asarray(out.advantages)[keep], np.asarray(ref["advantages"])[keep],
                               rtol=1e-4, atol=1e-4)
    chex.assert_tree_all_finite(out)


@settings(max_examples=30, deadline=None)
@given(batch=records(), seed=st.integers(0, 2**31 - 1))
def test_gate_never_rewards_a_wrong_answer(batch, seed):
    out = _compute(batch, RewardConfig(), jax.random.PRNGKey(seed))
    wrong = (np.asarray(batch.correct) == 0) & np.asarray(batch.mask)
    assert np.all(np.asarray(out.reward)[wrong] <= 0.0)
    assert np.all(np.asarray(out.credit)[wrong] == 0.0)


@settings(max_examples=30, deadline=None)
@given(r_base=hnp.arrays(np.float32, (8,), elements=st.sampled_from([0.0, 1.0])),
       pref=hnp.arrays(np.float32, (8,), elements=st.floats(0, 1, width=32, allow_subnormal=False)),
       pen=hnp.arrays(np.float32, (8,), elements=st.floats(0, 2, width=32, allow_subnormal=False)))
def test_gated_reward_properties(r_base, pref, pen):
    reward = np.asarray(gated_reward(r_base, pref, pen))
    wrong = r_base == 0
    np.testing.assert_allclose(reward[wrong], -pen[wrong], rtol=1e-6, atol=1e-30)  # XLA flushes denormals
    # Raising the preference of a wrong answer never changes its reward; the linear ablation does.
    np.testing.assert_array_equal(np.asarray(gated_reward(r_base, np.ones(8), pen))[wrong], reward[wrong])
    linear = np.asarray(linear_reward(r_base, pref, pen, weight=1.0))
    np.testing.assert_allclose(linear, r_base + pref - pen, rtol=1e-6)


class HandComputedTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_two_groups_by_hand(self):
        cfg = RewardConfig(alpha_win=1.0, alpha_lose=1.0, beta_lose=0.1, lambda_tool=0.5, lambda_len=0.5)
        batch = RolloutRecords(
            correct=jnp.array([[1.0, 0.0], [0.0, 0.0]]),
            preference=jnp.array([[0.8, 0.9], [0.7, 0.0]]),
            calls=jnp.array([[2, 4], [1, 0]]),
            failures=jnp.array([[0, 0], [0, 0]]),
            lengths=jnp.array([[100.0, 50.0], [10.0, 0.0]]),
            ref_lengths=jnp.array([[100.0, 100.0], [20.0, 20.0]]),
            mask=jnp.array([[True, True], [True, False]]),
        )
        out = self.variant(compute_rewards, static_argnames="cfg")(batch, cfg, jax.random.PRNGKey(3))
        # Group 0: W = {0}, b_g = 2 (range [2, 2]); rollout 1 has Δ = 2. Ŵ = {0}, b_win = 100, b_lose = 100.
        e = np.exp
        tool = [[0.0, (1 - e(-2.0)) + 0.1], [0.1, 0.0]]  # group 1: no winners -> β_lose only
        length = [[0.0, 1 - e(-(100 / 50 - 1))], [1 - e(-(20 / 10 - 1)), 0.0]]
        np.testing.assert_allclose(out.tool_penalty, tool, rtol=1e-6)
        np.testing.assert_allclose(out.length_penalty, length, rtol=1e-6)
        pen = 0.5 * np.array(tool) + 0.5 * np.array(length)
        reward = np.array([[0.8, 0.0], [0.0, 0.0]]) - pen * np.array([[1, 1], [1, 0]])
        np.testing.assert_allclose(out.reward, reward, rtol=1e-6)
        np.testing.assert_allclose(out.advantages[0], [1.0, -1.0], rtol=1e-5)  # two values: ±1 after std
        np.testing.assert_allclose(out.advantages[1], [0.0, 0.0], atol=1e-7)  # one valid rollout
        np.testing.assert_allclose(out.tool_baseline, [2.0, 0.0])
        metrics = reward_metrics(out)
        np.testing.assert_allclose(metrics["r_base"], 1 / 3, rtol=1e-6)
        np.testing.assert_allclose(metrics["frac_groups_with_winner"], 0.5)
        np.testing.assert_allclose(metrics["n_rollouts"], 3.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_unconditional_penalty_ablation(self):
        cfg = RewardConfig(penalties="unconditional", per_call=0.5, per_token=0.01, lambda_tool=1.0,
                           lambda_len=1.0)
        batch = RolloutRecords(correct=jnp.array([[1.0, 0.0]]), preference=jnp.array([[1.0, 1.0]]),
                               calls=jnp.array([[2, 0]]), failures=jnp.array([[1, 0]]),
                               lengths=jnp.array([[10.0, 30.0]]), ref_lengths=jnp.array([[5.0, 5.0]]),
                               mask=jnp.array([[True, True]]))
        out = self.variant(compute_rewards, static_argnames="cfg")(batch, cfg, jax.random.PRNGKey(0))
        np.testing.assert_allclose(out.efficiency_penalty, [[0.5 + 0.1, 0.3]], rtol=1e-6)
        np.testing.assert_allclose(out.reward, [[1.0 - 0.6, -0.3]], rtol=1e-6)


def test_python_baseline_draw_matches_the_range():
    import random

    recs = {"calls": [[1, 2, 6, 6, 9]], "failures": [[0] * 5], "correct": [[1, 1, 1, 1, 0]], "mask": [[1] * 5]}
    draws = {draw_baselines_python(recs, random.Random(s))[0] for s in range(200)}
    assert draws == {1.0, 2.0, 3.0, 4.0}


def test_mismatched_record_shapes_raise():
    batch = RolloutRecords(*(jnp.zeros((2, 3)) for _ in range(6)), mask=jnp.ones((2, 4), bool))
    with pytest.raises(ValueError, match="RolloutRecords"):
        compute_rewards(batch, RewardConfig(), jax.random.PRNGKey(0))


def test_shipped_reward_config_loads():
    cfg = load_yaml(RewardConfig, configs_dir() / "rewards" / "default.yaml")
    assert cfg == RewardConfig()


@settings(max_examples=30, deadline=None)
@given(a=hnp.arrays(np.float32, (3, 5), elements=st.floats(-10, 10, width=32)),
       b=hnp.arrays(np.float32, (3, 5), elements=st.floats(-10, 10, width=32)),
       mask=hnp.arrays(np.bool_, (3, 5)))
def test_group_covariance_is_numpys_population_covariance_over_each_groups_valid_rollouts(a, b, mask):
    got = np.asarray(group_covariance(jnp.asarray(a), jnp.asarray(b), jnp.asarray(mask)))
    for g in range(3):
        m = mask[g]
        want = np.cov(a[g][m], b[g][m], bias=True)[0, 1] if m.sum() > 1 else 0.0
        assert got[g] == pytest.approx(want, rel=1e-4, abs=1e-3)
    np.testing.assert_allclose(group_covariance(jnp.asarray(a), jnp.asarray(a), jnp.asarray(mask)),
                               [np.var(a[g][mask[g]]) if mask[g].any() else 0.0 for g in range(3)],
                               rtol=1e-4, atol=1e-3)


def test_calls_covariance_by_hand():
    """One group, gated, centred only: r_base [1, 1, 0, 0], s [.8, .6, .3, .9] (s̄_W = .7), pen_tool
    [0, 1, .1, .5] at λ_tool .1, calls [2, 4, 1, 3] (c̄ 2.5): correct +.175, preference −.05, tool −.04."""
    cfg = RewardConfig(normalize_std=False, lambda_tool=0.1, lambda_len=0.0)
    r_base, s = jnp.asarray([[1.0, 1, 0, 0]]), jnp.asarray([[0.8, 0.6, 0.3, 0.9]])
    tool, zero = jnp.asarray([[0.0, 1, 0.1, 0.5]]), jnp.zeros((1, 4))
    credit = r_base * s
    out = RewardBreakdown(reward=credit - 0.1 * tool, advantages=zero, r_base=r_base, preference=s, credit=credit,
                          tool_penalty=tool, length_penalty=zero + 0.3, efficiency_penalty=0.1 * tool,
                          tool_baseline=jnp.zeros(1), mask=jnp.ones((1, 4), bool))
    cov = {k: float(v[0]) for k, v in calls_covariance(out, jnp.asarray([[2, 4, 1, 3]]), cfg).items()}
    assert cov == pytest.approx({"correct": 0.175, "preference": -0.05, "tool": -0.04, "length": 0.0,
                                 "total": 0.085}, abs=1e-6)


@pytest.mark.parametrize("cfg", CONFIGS, ids=["default", "ablations"])
@settings(max_examples=30, deadline=None)
@given(batch=records(), seed=st.integers(0, 2**31 - 1))
def test_reward_terms_add_up_to_r_and_their_covariances_to_the_advantages(cfg, batch, seed):
    out = _compute(batch, cfg, jax.random.PRNGKey(seed))
    terms = reward_terms(out, cfg)
    np.testing.assert_allclose(sum(np.asarray(v) for v in terms.values()), out.reward, atol=1e-5)
    if cfg.aggregation == "gated":  # the gate: a loser's preference term is 0
        np.testing.assert_array_equal(np.asarray(terms["preference"])[np.asarray(out.r_base) < 0.5], 0.0)
    mask = np.asarray(out.mask)
    calls = np.asarray(batch.calls, np.float32)
    expected = []
    for g in range(N):  # the covariance of the Â compute_rewards returns with the calls, group by group
        m = mask[g]
        dc = calls[g][m] - calls[g][m].mean() if m.any() else calls[g][m]
        expected.append(float(np.mean(np.asarray(out.advantages)[g][m] * dc)) if m.any() else 0.0)
    cov = calls_covariance(out, batch.calls, cfg)
    # where the group std is tiny Â amplifies rounding (as above): compare groups whose rewards spread
    spread = np.array([np.ptp(np.asarray(out.reward)[g][mask[g]]) if mask[g].any() else 1.0 for g in range(N)])
    keep = spread > 1e-2
    np.testing.assert_allclose(np.asarray(cov["total"])[keep], np.asarray(expected)[keep], rtol=1e-4, atol=1e-4)
