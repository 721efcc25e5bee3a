"""Decode cache: prefill + decode ≡ full forward (padded rows, continuation, inactive rows, slot insert),
causality, and bf16. Every test uses batch 3, prompt chunks of 12 and a 16-slot cache, so compiled functions are
shared."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.model import decode_step, forward, init_cache, insert_cache, prefill
from searchjax.testing.models import random_tokens, tiny_model

ATOL = 2e-5  # fp32, logits of size ~1: different summation orders only
B, T, S = 3, 12, 16


def scaled_model(name):
    cfg, params = tiny_model(name, seed=7)
    # Larger weights than the 0.02 init so that every layer visibly changes the logits; chunk 4 = many chunks.
    params = jax.tree.map(lambda a: a * 4.0 if a.ndim >= 2 else a, params)
    return cfg.replace(chunk_size=4), params


@pytest.fixture(scope="module")
def model():
    return scaled_model("tiny")


def rows(full, idx):
    return full[jnp.arange(full.shape[0]), jnp.asarray(idx)]


def assert_decode_matches(params, cfg, cache, full, ref, pos):
    """One decode step feeding full[b, pos[b]] gives the full forward's logits at those positions."""
    step, cache = decode_step(params, rows(full, pos), cfg, cache)
    np.testing.assert_allclose(step, ref[np.arange(full.shape[0]), pos], atol=ATOL)
    return cache


def pad_to(tokens, t=T):
    return jnp.pad(tokens, [(0, 0), (0, t - tokens.shape[1])], constant_values=5)


@pytest.mark.parametrize("name", ["tiny", "alt"])
def test_padded_prefill_then_decode_equals_forward(name):
    cfg, params = scaled_model(name)
    full = random_tokens(0, B, S, cfg.vocab_size)
    lengths = jnp.array([12, 7, 3], jnp.int32)
    ref = np.asarray(forward(params, full, cfg))
    junk = random_tokens(1, B, T, cfg.vocab_size)
    prompt = jnp.where(jnp.arange(T)[None] < lengths[:, None], full[:, :T], junk)
    logits, cache = prefill(params, prompt, cfg, init_cache(cfg, B, S), lengths)
    for b, n in enumerate(np.asarray(lengths)):
        np.testing.assert_allclose(logits[b, :n], ref[b, :n], atol=ATOL)
    for i in range(4):
        cache = assert_decode_matches(params, cfg, cache, full, ref, np.asarray(lengths) + i)
    np.testing.assert_array_equal(cache.lengths, lengths + 4)


def test_multi_token_continuation(model):
    cfg, params = model
    full = random_tokens(2, B, S, cfg.vocab_size)
    ref = np.asarray(forward(params, full, cfg))
    _, cache = prefill(params, pad_to(full[:, :5]), cfg, init_cache(cfg, B, S), jnp.array([5, 5, 2]))
    n2 = np.array([6, 4, 9])
    parts = [full[0:1, 5:11], full[1:2, 5:9], full[2:3, 2:11]]  # continue rows 0, 1 at 5 and row 2 at 2
    cont = jnp.concatenate([pad_to(x) for x in parts])
    logits, cache = prefill(params, cont, cfg, cache, jnp.asarray(n2))
    np.testing.assert_allclose(logits[0, :6], ref[0, 5:11], atol=ATOL)
    np.testing.assert_allclose(logits[1, :4], ref[1, 5:9], atol=ATOL)
    np.testing.assert_allclose(logits[2, :9], ref[2, 2:11], atol=ATOL)
    assert_decode_matches(params, cfg, cache, full, ref, np.array([11, 9, 11]))


def test_inactive_rows_leave_cache_unchanged(model):
    cfg, params = model
    full = random_tokens(3, B, S, cfg.vocab_size)
    ref = np.asarray(forward(params, full, cfg))
    _, cache = prefill(params, pad_to(full[:, :4]), cfg, init_cache(cfg, B, S), jnp.array([4, 4, 4]))
    row1 = lambda c: jax.tree.map(lambda a: np.asarray(a[:, 1]) if a.ndim > 1 else np.asarray(a[1]), c)  # noqa
    before = row1(cache)
    _, cache = decode_step(params, full[:, 4], cfg, cache, jnp.array([True, False, True]))
    jax.tree.map(np.testing.assert_array_equal, before, row1(cache))
    assert_decode_matches(params, cfg, cache, full, ref, np.array([5, 4, 5]))


def test_insert_cache_into_slot(model):
    cfg, params = model
    full = random_tokens(4, B, S, cfg.vocab_size)
    ref = np.asarray(forward(params, full, cfg))
    _, batch = prefill(params, pad_to(full[:, :6]), cfg, init_cache(cfg, B, S), jnp.array([6, 6, 6]))
    _, one = prefill(params, pad_to(full[1:2, :3]), cfg, init_cache(cfg, 1, S), jnp.array([3]))
    batch = insert_cache(batch, one, 1)
    np.testing.assert_array_equal(batch.lengths, [6, 3, 6])
    batch = assert_decode_matches(params, cfg, batch, full, ref, np.array([6, 3, 6]))
    with pytest.raises(ValueError, match="one_cache holds 5 positions, batch_cache 16"):
        insert_cache(batch, init_cache(cfg, 1, 5), 0)


def test_causality(model):
    """∂ logits[t] / ∂ embedding of any later token is exactly zero (distinct tokens; untied unembedding)."""
    cfg, params = model
    tokens = (jnp.arange(S, dtype=jnp.int32) * 7 + 3)[None] % cfg.vocab_size
    grad_fn = jax.jit(jax.grad(lambda e, t: forward(params.replace(embed=e), tokens, cfg)[0, t].sum()))
    for t in (0, 5, 13):
        grad = np.asarray(grad_fn(params.embed, t))
        later, upto = np.asarray(tokens[0, t + 1:]), np.asarray(tokens[0, : t + 1])
        assert np.all(grad[later] == 0.0)
        assert np.all(np.abs(grad[upto]).sum(axis=-1) > 0)


def test_bfloat16_forward_and_decode_close_to_fp32():
    cfg, params = tiny_model("tiny", seed=7)
    tokens = random_tokens(5, B, S, cfg.vocab_size)
    ref = np.asarray(forward(params, tokens, cfg))
    _, p16 = tiny_model("tiny", seed=7, dtype="bfloat16")  # the same draw, rounded; A_log stays fp32
    assert p16.embed.dtype == jnp.bfloat16 and p16.linear.a_log.dtype == jnp.float32
    out = forward(p16, tokens, cfg)
    # bf16 keeps ~3 significant digits; a rare routing flip moves a token's logits by a few %.
    scale, err = np.abs(ref).max(), np.abs(np.asarray(out) - ref)
    assert out.dtype == jnp.float32
    assert err.max() <= 0.05 * scale and err.mean() <= 0.01 * np.abs(ref).mean()
    logits, cache = prefill(p16, tokens[:, :T], cfg, init_cache(cfg, B, S, jnp.bfloat16), jnp.full((B,), T))
    assert cache.state.dtype == jnp.float32 and cache.k.dtype == jnp.bfloat16
    step, _ = decode_step(p16, tokens[:, T], cfg, cache)
    assert np.abs(np.asarray(step) - ref[:, T]).max() <= 0.05 * scale


def test_hidden_states_then_unembed_is_forward(model):
    """logits = unembed(hidden_states) with params.unembed [V, D]."""
    from searchjax.model import hidden_states, unembed

    cfg, params = model
    tokens = random_tokens(6, B, T, cfg.vocab_size)
    assert params.unembed.shape == (cfg.vocab_size, cfg.hidden_size)
    h = hidden_states(params, tokens, cfg)
    np.testing.assert_allclose(unembed(params, h), forward(params, tokens, cfg), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_scan_unrolled_and_remat_agree(model):
    """layer_loop "scan" and "unroll" compute the same logits and cache, and the same gradients (of a loss with the
    router's auxiliary term) with and without remat: the four gradients to rtol 1e-5."""
    cfg, params = model
    tokens = random_tokens(8, B, T, cfg.vocab_size)
    scan, unroll = cfg.replace(layer_loop="scan"), cfg.replace(layer_loop="unroll")

    def loss(p, c, remat):
        logits, aux = forward(p, tokens, c, remat=remat, return_aux=True)
        return jnp.mean(jax.nn.logsumexp(logits, -1)) + c.router_aux_loss_coef * aux["router_aux_loss"]

    np.testing.assert_allclose(forward(params, tokens, scan), forward(params, tokens, unroll), atol=ATOL)
    ref = jax.grad(loss)(params, unroll, False)
    for c, remat in ((unroll, True), (scan, False), (scan, True)):
        got = jax.grad(loss)(params, c, remat)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got, ref)
    outs = []
    for c in (scan, unroll):
        logits, cache = prefill(params, tokens, c, init_cache(c, B, S), jnp.full((B,), T))
        step, cache = decode_step(params, tokens[:, 0], c, cache)
        outs.append((logits, step, cache))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=ATOL), outs[0], outs[1])


def test_take_and_put_rows():
    """take_rows gathers rows (out of range and `empty` rows read as empty ones); put_rows writes them back."""
    from searchjax.model.cache import put_rows, take_rows
    from searchjax.testing.models import tiny_config

    cfg = tiny_config("tiny")
    leaves, treedef = jax.tree.flatten(init_cache(cfg, 4, 8))
    keys = jax.random.split(jax.random.key(0), len(leaves))
    filled = jax.tree.unflatten(treedef, [(jax.random.normal(k, a.shape) + 1).astype(a.dtype)
                                          for k, a in zip(keys, leaves)])
    part = take_rows(filled, jnp.array([2, 4, 0]), empty=jnp.array([False, False, True]))
    for name in ("lengths", "k", "conv_q", "state"):
        axis = 0 if name == "lengths" else 1
        got, full = np.asarray(getattr(part, name)), np.asarray(getattr(filled, name))
        np.testing.assert_array_equal(np.take(got, 0, axis), np.take(full, 2, axis))
        assert not np.take(got, 1, axis).any() and not np.take(got, 2, axis).any()
    back = put_rows(init_cache(cfg, 4, 8), jnp.array([3, 4, 1]), part)  # row index 4 is out of range: dropped
    np.testing.assert_array_equal(np.asarray(back.state)[:, 3], np.asarray(filled.state)[:, 2])
    assert not np.asarray(back.state)[:, [0, 1, 2]].any()
