"""grpo_loss and sequence_grpo_loss (RECIPE.md §2): values, exact gradients, IS cap, PPO clip, padding."""

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.losses import grpo_loss, sequence_grpo_loss

B, T = 4, 6


@st.composite
def batches(draw):
    logp = draw(hnp.arrays(np.float32, (B, T), elements=st.floats(-6, 0, width=32, allow_subnormal=False)))
    shift = draw(hnp.arrays(np.float32, (B, T), elements=st.floats(-0.75, 0.75, width=32, allow_subnormal=False)))
    adv = draw(hnp.arrays(np.float32, (B,), elements=st.floats(-2, 2, width=32, allow_subnormal=False)))
    mask = draw(hnp.arrays(bool, (B, T)))
    return logp, logp + shift, adv, mask


def _grad(fn, logp, *args, **kw):
    return jax.grad(lambda x: fn(x, *args, **kw)[0])(jnp.asarray(logp))


_grad_jit = jax.jit(_grad, static_argnums=0, static_argnames=("is_cap",))


def _expected_grad(weight, adv, mask):
    n_tok = mask.sum(-1)
    n_seq = max((n_tok > 0).sum(), 1)
    return np.where(mask, -weight * adv[:, None] / (n_seq * np.maximum(n_tok, 1))[:, None], 0.0)


@pytest.mark.parametrize("use_jit", [False, True])
@settings(max_examples=30, deadline=None)
@given(batch=batches(), cap=st.sampled_from([None, 1.1, 1.5]))
def test_gradient_is_minus_r_adv_over_b_len(use_jit, batch, cap):
    logp, logp_infer, adv, mask = batch
    grad = (_grad_jit if use_jit else _grad)(grpo_loss, logp, logp_infer, adv, mask, is_cap=cap)
    ratio = np.exp(logp.astype(np.float64) - logp_infer)
    weight = ratio if cap is None else np.minimum(ratio, cap)
    np.testing.assert_allclose(grad, _expected_grad(weight, adv, mask), rtol=2e-5, atol=1e-7)
    if cap is not None:  # the effective per-token weight never exceeds the cap
        n_tok = mask.sum(-1, keepdims=True)
        n_seq = max((mask.sum(-1) > 0).sum(), 1)
        eff = np.abs(np.asarray(grad)) * n_seq * np.maximum(n_tok, 1)
        nz = mask & (np.abs(adv)[:, None] > 1e-3)
        assert np.all(eff[nz] / np.abs(adv[:, None] * np.ones_like(eff))[nz] <= cap * (1 + 1e-5))


@settings(max_examples=20, deadline=None)
@given(batch=batches(), length=st.sampled_from([1, 7, 100]))
def test_constant_norm_length_gives_every_token_the_same_weight(batch, length):
    """norm_length=L: ∂loss/∂log π_{i,t} = −r Â_i / (B L), whatever the rollout's length, and the loss is the
    per-rollout mean's times |o_i| / L row by row."""
    logp, logp_infer, adv, mask = batch
    grad = _grad(grpo_loss, logp, logp_infer, adv, mask, norm_length=length)
    ratio = np.exp(logp.astype(np.float64) - logp_infer)
    n_seq = max((mask.sum(-1) > 0).sum(), 1)
    want = np.where(mask, -ratio * adv[:, None] / (n_seq * length), 0.0)
    np.testing.assert_allclose(grad, want, rtol=2e-5, atol=1e-7)
    n_tok = mask.sum(-1)
    rows = [grpo_loss(logp[i:i + 1], logp_infer[i:i + 1], adv[i:i + 1], mask[i:i + 1])[0] * n_tok[i] / length
            for i in range(B) if n_tok[i]]
    got = grpo_loss(logp, logp_infer, adv, mask, norm_length=length)[0]
    np.testing.assert_allclose(got, np.sum(rows) / n_seq if rows else 0.0, rtol=1e-5, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(batch=batches())
def test_value_and_metrics(batch):
    logp, logp_infer, adv, mask = batch
    loss, metrics = grpo_loss(logp, logp_infer, adv, mask, is_cap=1.2)
    ratio = np.exp(logp.astype(np.float64) - logp_infer)
    n_tok = mask.sum(-1)
    per_seq = np.where(mask, np.minimum(ratio, 1.2) * adv[:, None], 0).sum(-1) / np.maximum(n_tok, 1)
    np.testing.assert_allclose(loss, -per_seq.sum() / max((n_tok > 0).sum(), 1), rtol=1e-5, atol=1e-6)
    if mask.any():
        np.testing.assert_allclose(metrics["kl_infer"], (logp_infer - logp.astype(np.float64))[mask].mean(),
                                   rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(metrics["ratio_max"], ratio[mask].max(), rtol=1e-5)
        np.testing.assert_allclose(metrics["ratio_mean"], ratio[mask].mean(), rtol=1e-5)
        np.testing.assert_allclose(metrics["frac_truncated"], (ratio[mask] > 1.2).mean(), atol=1e-6)
    assert float(metrics["n_tokens"]) == mask.sum()


class HandComputedTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_on_policy_value_is_mean_advantage(self):
        # r = 1 everywhere: loss = −mean_i Â_i over sequences with tokens; row 2 is padding.
        logp = jnp.log(jnp.full((3, 4), 0.3))
        mask = jnp.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], bool)
        loss, metrics = self.variant(grpo_loss)(logp, logp, jnp.array([1.0, -0.5, 9.0]), mask)
        np.testing.assert_allclose(loss, -(1.0 - 0.5) / 2, rtol=1e-6)
        np.testing.assert_allclose(metrics["kl_infer"], 0.0, atol=1e-7)
        np.testing.assert_allclose(metrics["n_tokens"], 6.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_ppo_clip_first_step_equals_plain(self):
        key = jax.random.PRNGKey(0)
        logp = -jax.random.uniform(key, (B, T), minval=0.1, maxval=3.0)
        infer = logp + 0.1 * jax.random.normal(jax.random.fold_in(key, 1), (B, T))
        adv = jnp.array([1.0, -1.0, 0.5, 2.0])
        mask = jnp.ones((B, T), bool).at[1, 3:].set(False)

        def both(x):
            return (grpo_loss(x, infer, adv, mask, is_cap=1.05)[0],
                    grpo_loss(x, infer, adv, mask, is_cap=1.05, clip_eps=0.2, logp_old=x)[0])

        (plain, clipped) = self.variant(both)(logp)
        np.testing.assert_allclose(clipped, plain, rtol=1e-6)
        g_plain = jax.grad(lambda x: both(x)[0])(logp)
        g_clip = jax.grad(lambda x: grpo_loss(x, infer, adv, mask, is_cap=1.05, clip_eps=0.2,
                                              logp_old=logp)[0])(logp)
        np.testing.assert_allclose(g_clip, g_plain, rtol=1e-5, atol=1e-8)

    @chex.variants(with_jit=True, without_jit=True)
    def test_ppo_clip_zeroes_gradient_outside_trust_region(self):
        old = jnp.log(jnp.full((2, 1), 0.5))
        logp = old + jnp.array([[0.5], [0.5]])  # ρ = e^0.5 ≈ 1.65 > 1 + ε
        adv = jnp.array([1.0, -1.0])
        mask = jnp.ones((2, 1), bool)
        fn = self.variant(lambda x: grpo_loss(x, old, adv, mask, clip_eps=0.2, logp_old=old))
        grad = jax.grad(lambda x: fn(x)[0])(logp)
        # Â > 0 and ρ > 1 + ε: clipped, no gradient. Â < 0: min picks the unclipped ρÂ, gradient −ρÂ/B.
        np.testing.assert_allclose(grad[:, 0], [0.0, np.exp(0.5) / 2], rtol=1e-6)
        np.testing.assert_allclose(fn(logp)[1]["clip_frac"], 1.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_sequence_level_is(self):
        logp = jnp.array([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
        infer = jnp.array([[-1.2, -2.2, -3.5], [-0.5, -0.7, -9.0]])
        mask = jnp.array([[1, 1, 1], [1, 1, 0]], bool)
        adv = jnp.array([1.0, -2.0])
        fn = self.variant(lambda x: sequence_grpo_loss(x, infer, adv, mask))
        s = np.exp([(0.2 + 0.2 + 0.5) / 3, (0.0 + 0.2) / 2])
        np.testing.assert_allclose(fn(logp)[0], -(s[0] * 1.0 + s[1] * -2.0) / 2, rtol=1e-6)
        grad = jax.grad(lambda x: fn(x)[0])(logp)
        want = np.array([[-s[0] / 6] * 3, [s[1] / 2, s[1] / 2, 0.0]])
        np.testing.assert_allclose(grad, want, rtol=1e-6)
        capped = jax.grad(lambda x: sequence_grpo_loss(x, infer, adv, mask, is_cap=1.1)[0])(logp)
        np.testing.assert_allclose(capped[0], [-1.1 / 6] * 3, rtol=1e-6)  # s_0 ≈ 1.35 truncated to 1.1


def test_padding_rows_and_columns_do_not_change_loss():
    key = jax.random.PRNGKey(7)
    logp = -jax.random.uniform(key, (B, T), minval=0.1, maxval=3.0)
    infer = logp - 0.05
    adv = jnp.array([1.0, -1.0, 0.5, 2.0])
    mask = jnp.ones((B, T), bool)
    loss, _ = grpo_loss(logp, infer, adv, mask, is_cap=1.02)
    pad = lambda x, v: jnp.pad(x, ((0, 2), (0, 3)), constant_values=v)
    loss_p, metrics = grpo_loss(pad(logp, 50.0), pad(infer, -50.0), jnp.pad(adv, (0, 2), constant_values=3.0),
                                pad(mask, False), is_cap=1.02)
    np.testing.assert_allclose(loss_p, loss, rtol=1e-6)
    chex.assert_tree_all_finite((loss_p, metrics))


def test_bad_arguments_raise():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(x, x, jnp.zeros(3), x)
    with pytest.raises(ValueError, match="logp_infer shape"):
        grpo_loss(x, jnp.zeros((2, 4)), jnp.zeros(2), x)
    with pytest.raises(ValueError, match="together"):
        grpo_loss(x, x, jnp.zeros(2), x, clip_eps=0.2)
    with pytest.raises(ValueError, match="is_cap"):
        grpo_loss(x, x, jnp.zeros(2), x, is_cap=0.0)
    with pytest.raises(ValueError, match="norm_length"):
        grpo_loss(x, x, jnp.zeros(2), x, norm_length=0)


def test_policy_loss_follows_the_config():
    from searchjax.losses import policy_loss
    from searchjax.rewards import RewardConfig

    key = jax.random.PRNGKey(3)
    logp = -jax.random.uniform(key, (B, T), minval=0.1, maxval=3.0)
    infer = logp + 0.2 * jax.random.normal(jax.random.fold_in(key, 1), (B, T))
    old = logp + 0.3 * jax.random.normal(jax.random.fold_in(key, 2), (B, T))
    adv = jnp.array([1.0, -1.0, 0.5, 2.0])
    mask = jnp.ones((B, T), bool)
    cases = [
        (RewardConfig(), grpo_loss(logp, infer, adv, mask)),
        (RewardConfig(is_cap=1.1), grpo_loss(logp, infer, adv, mask, is_cap=1.1)),
        (RewardConfig(clip_eps=0.2), grpo_loss(logp, infer, adv, mask, clip_eps=0.2, logp_old=old)),
        (RewardConfig(sequence_is=True, is_cap=1.1), sequence_grpo_loss(logp, infer, adv, mask, is_cap=1.1)),
        (RewardConfig(norm_length=64), grpo_loss(logp, infer, adv, mask, norm_length=64)),
    ]
    for cfg, (want, _) in cases:
        np.testing.assert_allclose(policy_loss(logp, infer, adv, mask, cfg, logp_old=old)[0], want, rtol=1e-6)
    with pytest.raises(ValueError, match="logp_old"):
        policy_loss(logp, infer, adv, mask, RewardConfig(clip_eps=0.2))


def test_capped_weights_stay_finite_for_huge_log_ratios():
    logp = jnp.array([[0.0, -1.0]])
    infer = jnp.array([[-200.0, -1.0]])  # log r = 200: r overflows float32, the capped weight must not
    mask = jnp.ones((1, 2), bool)
    for fn in (grpo_loss, sequence_grpo_loss):
        loss, grad = jax.value_and_grad(lambda x: fn(x, infer, jnp.array([1.0]), mask, is_cap=2.0)[0])(logp)
        chex.assert_tree_all_finite((loss, grad))
    grad = jax.grad(lambda x: grpo_loss(x, infer, jnp.array([1.0]), mask, is_cap=2.0)[0])(logp)
    np.testing.assert_allclose(grad, [[-1.0, -0.5]], rtol=1e-5)  # weights C = 2 and r = 1, over B·|o| = 2


def test_ppo_frac_truncated_counts_the_truncated_old_weight():
    # π_old/μ = e^0.5 > C = 1.2 on token 0 only; π_θ/μ = 1 everywhere, so r itself is never above C.
    infer = jnp.zeros((1, 2))
    old = jnp.array([[0.5, 0.0]])
    mask = jnp.ones((1, 2), bool)
    _, metrics = grpo_loss(infer, infer, jnp.array([1.0]), mask, is_cap=1.2, clip_eps=0.2, logp_old=old)
    np.testing.assert_allclose(metrics["frac_truncated"], 0.5)
    _, plain = grpo_loss(infer, infer, jnp.array([1.0]), mask, is_cap=1.2)
    np.testing.assert_allclose(plain["frac_truncated"], 0.0)


@pytest.mark.parametrize("kw, match", [
    (dict(is_cap=-1.0, clip_eps=0.2), "is_cap"),
    (dict(clip_eps=0.0), "clip_eps"),
    (dict(clip_eps=1.5), "clip_eps"),
])
def test_bad_cap_or_clip_raise_in_the_ppo_variant(kw, match):
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match=match):
        grpo_loss(x, x, jnp.zeros(2), x, logp_old=x, **kw)
