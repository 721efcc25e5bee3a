"""The optimizer from config: schedules and AdamW values against formulas computed by hand, masks, clipping."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from searchjax.train.config import OptimConfig
from searchjax.train.optim import decay_mask, lr_schedule, make_optimizer


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant"])
def test_schedule_values_by_hand(kind):
    cfg = OptimConfig(learning_rate=1e-3, warmup_steps=10, schedule=kind, end_lr_ratio=0.1)
    total = 110
    lr = lr_schedule(cfg, total)
    for t in (0, 5, 10, 35, 60, 109, 110):
        if t < 10:
            want = 1e-3 * t / 10
        else:
            frac = (t - 10) / 100
            if kind == "cosine":
                want = 1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + math.cos(math.pi * frac))
            elif kind == "linear":
                want = 1e-3 + (1e-4 - 1e-3) * frac
            else:
                want = 1e-3
        assert float(lr(t)) == pytest.approx(want, rel=1e-5, abs=1e-9), (kind, t)


def test_adamw_first_steps_by_hand():
    """Two AdamW steps with weight decay on the matrix only, no clipping: moments and bias correction by hand."""
    cfg = OptimConfig(learning_rate=0.1, warmup_steps=0, schedule="constant", b1=0.9, b2=0.99, eps=1e-8,
                      weight_decay=0.5, clip_norm=None)
    params = {"w": jnp.array([[1.0, -2.0], [0.5, 3.0]]), "norm": jnp.array([1.0, 2.0])}
    grads = [{"w": jnp.array([[0.1, 0.2], [-0.3, 0.4]]), "norm": jnp.array([0.5, -0.5])},
             {"w": jnp.array([[0.2, -0.1], [0.0, 0.3]]), "norm": jnp.array([0.1, 0.2])}]
    tx = make_optimizer(cfg, 100)
    state = tx.init(params)
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, g in enumerate(grads, 1):
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
        for k in p:
            gk = np.asarray(g[k], np.float64)
            m[k] = 0.9 * m[k] + 0.1 * gk
            v[k] = 0.99 * v[k] + 0.01 * gk**2
            mhat, vhat = m[k] / (1 - 0.9**t), v[k] / (1 - 0.99**t)
            decay = 0.5 * p[k] if p[k].ndim >= 2 else 0.0
            p[k] = p[k] - 0.1 * (mhat / (np.sqrt(vhat) + 1e-8) + decay)
    for k in p:
        np.testing.assert_allclose(np.asarray(params[k]), p[k], rtol=1e-6, atol=1e-7)


def test_clipping_by_global_norm():
    cfg = OptimConfig(learning_rate=1.0, schedule="constant", clip_norm=1.0, weight_decay=0.0, b1=0.0, b2=0.0,
                      eps=1e-12)
    params = {"a": jnp.zeros((2, 2))}
    g = {"a": jnp.full((2, 2), 10.0)}  # global norm 20 -> clipped to 1 (entries 0.5); Adam with β=0 then steps by lr·sign
    tx = make_optimizer(cfg, 10)
    clipped, _ = optax.clip_by_global_norm(1.0).update(g, optax.clip_by_global_norm(1.0).init(params))
    assert float(optax.global_norm(clipped)) == pytest.approx(1.0, rel=1e-6)
    updates, _ = tx.update(g, tx.init(params), params)
    np.testing.assert_allclose(np.asarray(updates["a"]), -1.0, rtol=1e-6)


def test_decay_mask_and_frozen_leaves():
    params = {"w": jnp.ones((3, 3)), "b": jnp.ones((3,)), "head": jnp.ones((3, 1))}
    assert jax.tree.map(bool, decay_mask(params)) == {"w": True, "b": False, "head": True}
    tx = make_optimizer(OptimConfig(learning_rate=0.1, clip_norm=None), 10,
                        trainable={"w": False, "b": False, "head": True})
    g = jax.tree.map(jnp.ones_like, params)
    updates, _ = tx.update(g, tx.init(params), params)
    assert float(jnp.abs(updates["w"]).max()) == 0.0 and float(jnp.abs(updates["b"]).max()) == 0.0
    assert float(jnp.abs(updates["head"]).min()) > 0.0


def test_bad_optim_config_names_the_field():
    with pytest.raises(TypeError, match="micro_batches"):
        OptimConfig(micro_batches=0)
    with pytest.raises(TypeError, match="clip_norm"):
        OptimConfig(clip_norm=-1.0)
