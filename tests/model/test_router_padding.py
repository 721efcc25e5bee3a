"""The training forward's `valid` mask: padding does not enter the router load-balancing loss L_aux.

L_aux = E · Σ_e f_e · P_e sums over the (valid token, layer) rows only (moe.py), so a right-padded batch gives the
loss of its real tokens whatever the padding's width or content; without the mask the padding counts.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.model import forward, hidden_states
from searchjax.testing.models import random_tokens, tiny_model

WIDTH = 12  # the narrow batch; the wide one adds 4 padding columns (two shapes: two compilations per function)


@pytest.fixture(scope="module")
def model():
    cfg, params = tiny_model("tiny", seed=3)
    # Larger router weights than the 0.02 init, so that routing depends visibly on the token.
    moe = params.linear.moe.replace(router=params.linear.moe.router * 20.0)
    return cfg, params.replace(linear=params.linear.replace(moe=moe))


def _batch(cfg, lengths, width, pad_seed):
    """Two real sequences (the same for every call) of the given lengths, right-padded with random ids."""
    real = random_tokens(0, len(lengths), WIDTH, cfg.vocab_size)
    pad = random_tokens(pad_seed, len(lengths), width, cfg.vocab_size)
    valid = jnp.arange(width)[None, :] < jnp.asarray(lengths)[:, None]
    real = jnp.pad(real, ((0, 0), (0, width - WIDTH)))
    return jnp.where(valid, real, pad), valid


def _aux(params, cfg, tokens, valid=None):
    return float(hidden_states(params, tokens, cfg, return_aux=True, valid=valid)[1]["router_aux_loss"])


def test_padding_does_not_change_the_router_aux_loss(model):
    cfg, params = model
    # Against the truth: the same rows with no padding at all.
    unpadded, _ = _batch(cfg, (WIDTH, WIDTH), WIDTH, pad_seed=1)
    padded, valid = _batch(cfg, (WIDTH, WIDTH), WIDTH + 4, pad_seed=2)
    np.testing.assert_allclose(_aux(params, cfg, padded, valid), _aux(params, cfg, unpadded), rtol=1e-6)
    # Rows of different lengths: the padding's width and content do not matter.
    narrow, valid_n = _batch(cfg, (WIDTH, 7), WIDTH, pad_seed=1)
    wide, valid_w = _batch(cfg, (WIDTH, 7), WIDTH + 4, pad_seed=2)
    masked = _aux(params, cfg, narrow, valid_n)
    np.testing.assert_allclose(_aux(params, cfg, wide, valid_w), masked, rtol=1e-6)
    # Unmasked, the padding rows count (the statistic this test guards against).
    assert abs(_aux(params, cfg, narrow) - masked) > 1e-3 * masked


def test_valid_changes_nothing_else(model):
    cfg, params = model
    tokens, valid = _batch(cfg, (WIDTH, 7), WIDTH, pad_seed=1)
    h, aux = hidden_states(params, tokens, cfg, return_aux=True)
    h_every, aux_every = hidden_states(params, tokens, cfg, return_aux=True, valid=jnp.ones(tokens.shape, bool))
    np.testing.assert_allclose(h_every, h, rtol=0, atol=1e-6)  # two compilations: summation order only
    np.testing.assert_allclose(float(aux_every["router_aux_loss"]), float(aux["router_aux_loss"]), rtol=1e-6)
    # The mask reaches the router statistics only; forward passes it on.
    h_masked, aux_masked = hidden_states(params, tokens, cfg, return_aux=True, valid=valid)
    np.testing.assert_array_equal(h_masked, h_every)
    logits, aux_forward = forward(params, tokens, cfg, return_aux=True, valid=valid)
    assert float(aux_forward["router_aux_loss"]) == pytest.approx(float(aux_masked["router_aux_loss"]), rel=1e-6)
    assert logits.shape == (*tokens.shape, cfg.vocab_size)
