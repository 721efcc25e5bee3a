"""Packed rows (`hidden_states(segments=...)`): every sequence of a packed row gets the hidden states, logits and
gradients it gets alone, whatever shares its row, with segment boundaries inside DeltaNet chunks and sequences
spanning several chunks; without segments nothing changes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.data.bucketing import pad_rows
from searchjax.model.deltanet import causal_conv, chunked_delta_rule
from searchjax.model.transformer import forward, segment_positions
from searchjax.testing.models import random_tokens, tiny_model

LENGTHS = (7, 37, 1, 19, 16)  # chunk 16: boundaries mid-chunk and on a chunk edge (64), a 1-token sequence
WIDTH = 96


@pytest.fixture(scope="module", params=["unroll", "scan"])
def model(request):
    return tiny_model(layer_loop=request.param)


def _packed(cfg, seed=0):
    seqs = [np.asarray(random_tokens(seed + i, 1, n, cfg.vocab_size))[0] for i, n in enumerate(LENGTHS)]
    row = np.zeros((1, WIDTH), np.int32)
    seg = np.zeros((1, WIDTH), np.int32)
    at = 0
    for i, s in enumerate(seqs):
        row[0, at: at + len(s)], seg[0, at: at + len(s)] = s, i + 1
        at += len(s)
    return seqs, jnp.asarray(row), jnp.asarray(seg)


def test_segment_positions_restart_in_every_segment():
    seg = jnp.array([[1, 1, 1, 2, 2, 3, 0, 0], [5, 5, 5, 5, 5, 5, 5, 5]])
    np.testing.assert_array_equal(segment_positions(seg), [[0, 1, 2, 0, 1, 0, 0, 1], list(range(8))])


def _alone(seqs):
    """The sequences unpacked, one per row, right-padded to the longest (`pad_rows`: input_ids, and loss_mask = 1
    where the next token is in the row's own sequence). Causal: padding after a sequence changes none of its
    logits, so one batch is every sequence run alone."""
    return pad_rows([(s, np.ones_like(s)) for s in seqs], max(len(s) for s in seqs), pad_id=0)


def test_each_packed_sequence_has_the_logits_it_has_alone(model):
    cfg, params = model
    seqs, row, seg = _packed(cfg)
    packed = forward(params, row, cfg, segments=seg)
    alone = forward(params, jnp.asarray(_alone(seqs)["input_ids"]), cfg)
    at = 0
    for i, s in enumerate(seqs):
        np.testing.assert_allclose(packed[0, at: at + len(s)], alone[i, : len(s)], atol=2e-5, rtol=2e-5)
        at += len(s)


def test_one_segment_row_equals_the_unpacked_forward(model):
    cfg, params = model
    toks = random_tokens(9, 2, 40, cfg.vocab_size)
    np.testing.assert_allclose(forward(params, toks, cfg, segments=jnp.ones_like(toks)), forward(params, toks, cfg),
                               atol=1e-5, rtol=1e-5)


def test_packed_gradient_is_the_sum_of_the_sequences_gradients(model):
    """d/dθ Σ_tokens log p(next) over a packed row = Σ over the sequences of the same, each run alone (`_alone`:
    one batch, the padding's positions left out of the sum), so two programs compile, not one per length."""
    cfg, params = model
    seqs, row, seg = _packed(cfg, seed=20)
    alone = _alone(seqs)

    def logp_sum(p, toks, keep, segments=None):
        logits = forward(p, toks, cfg, segments=segments)
        lp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        picked = jnp.take_along_axis(lp, toks[:, 1:, None], axis=-1)[..., 0]
        return jnp.where(keep, picked, 0.0).sum()

    same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)  # the next token is in the same sequence
    packed = jax.jit(jax.grad(lambda p: logp_sum(p, row, same, seg)))(params)
    keep = jnp.asarray(alone["loss_mask"][:, :-1] > 0)
    summed = jax.jit(jax.grad(lambda p: logp_sum(p, jnp.asarray(alone["input_ids"]), keep)))(params)
    for a, b in zip(jax.tree.leaves(packed), jax.tree.leaves(summed)):
        np.testing.assert_allclose(a, b, atol=2e-4, rtol=2e-4)


def test_delta_rule_restarts_at_segment_starts():
    """The chunked rule on a packed row = the rule on each segment from a zero state (values and final state)."""
    rng = np.random.default_rng(0)
    b, nv, dk, dv, lens = 1, 2, 8, 4, (5, 19, 8)
    t = sum(lens)
    q, k = (rng.standard_normal((b, t, nv, dk)).astype(np.float32) * 0.3 for _ in range(2))
    v = rng.standard_normal((b, t, nv, dv)).astype(np.float32)
    g = -rng.uniform(0.01, 0.5, (b, t, nv)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (b, t, nv)).astype(np.float32)
    seg = np.repeat(np.arange(1, len(lens) + 1), lens)[None]
    s0 = jnp.zeros((b, nv, dk, dv))
    o, s = chunked_delta_rule(q, k, v, g, beta, s0, 8, jnp.asarray(seg))
    at = 0
    for n in lens:
        sl = slice(at, at + n)
        o1, s1 = chunked_delta_rule(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], s0, 8)
        np.testing.assert_allclose(o[:, sl], o1, atol=1e-5)
        at += n
    np.testing.assert_allclose(s, s1, atol=1e-5)  # the carried state is the last segment's


def test_conv_restarts_at_segment_starts():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((1, 10, 3)).astype(np.float32))
    w = jnp.asarray(rng.standard_normal((4, 3)).astype(np.float32))
    state = jnp.zeros((1, 4, 3))
    seg = jnp.asarray([[1, 1, 1, 2, 2, 2, 2, 2, 3, 3]])
    out, _ = causal_conv(x, w, state, jnp.array([10]), seg)
    for lo, hi in ((0, 3), (3, 8), (8, 10)):
        alone, _ = causal_conv(x[:, lo:hi], w, state, jnp.array([hi - lo]))
        np.testing.assert_allclose(out[:, lo:hi], alone, atol=1e-6)
