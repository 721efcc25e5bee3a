"""Routing replay in the model: the forward routes tokens as recorded, prefill and decode report the experts they
used, and without replay (or replaying the router's own choice) nothing changes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.model.cache import init_cache
from searchjax.model.transformer import decode_step, forward, hidden_states, prefill_last
from searchjax.testing.models import random_tokens, tiny_model


@pytest.fixture(scope="module", params=["unroll", "scan"])
def model(request):
    return tiny_model(layer_loop=request.param)


def test_replaying_the_routers_own_choice_changes_nothing(model):
    cfg, params = model
    toks = random_tokens(0, 2, 24, cfg.vocab_size)
    logits, aux = forward(params, toks, cfg, return_aux=True)
    own = aux["routes_own"]
    assert own.shape == (2, 24, cfg.num_hidden_layers, cfg.num_experts_per_tok)
    np.testing.assert_array_equal(forward(params, toks, cfg, routes=own), logits)
    np.testing.assert_array_equal(forward(params, toks, cfg, routes=jnp.full_like(own, -1)), logits)  # −1: own


def test_replayed_routes_are_used_where_given(model):
    """Another expert set changes the logits from that position on only; a −1 row routes by the router."""
    cfg, params = model
    toks = random_tokens(1, 1, 20, cfg.vocab_size)
    logits, aux = forward(params, toks, cfg, return_aux=True)
    routes = np.full(aux["routes_own"].shape, -1, np.int32)
    routes[0, 9, 1] = (np.asarray(aux["routes_own"])[0, 9, 1] + 1) % cfg.num_experts  # token 9, layer 1
    replayed = forward(params, toks, cfg, routes=jnp.asarray(routes))
    np.testing.assert_array_equal(replayed[:, :9], logits[:, :9])  # causal: earlier positions unchanged
    assert float(jnp.abs(replayed[:, 9:] - logits[:, 9:]).max()) > 1e-4


def test_replay_keeps_the_routers_gradient(model):
    """The replayed experts' weights are the router's own probabilities: the router still learns."""
    cfg, params = model
    toks = random_tokens(2, 2, 16, cfg.vocab_size)
    own = forward(params, toks, cfg, return_aux=True)[1]["routes_own"]
    shifted = (own + 1) % cfg.num_experts

    def loss(p):
        return jnp.mean(hidden_states(p, toks, cfg, routes=shifted) ** 2)

    grads = jax.grad(loss)(params)
    routers = [g for path, g in jax.tree_util.tree_flatten_with_path(grads)[0] if "router" in jax.tree_util.keystr(path)]
    assert routers and all(float(jnp.abs(g).max()) > 0 for g in routers)


def test_prefill_and_decode_report_the_experts_the_forward_chooses(model):
    cfg, params = model
    toks = random_tokens(3, 2, 24, cfg.vocab_size)
    own = np.sort(np.asarray(forward(params, toks, cfg, return_aux=True)[1]["routes_own"]), axis=-1)
    cache = init_cache(cfg, 2, 64)
    _, cache, pre = prefill_last(params, toks[:, :16], cfg, cache, jnp.array([16, 11]), return_routes=True)
    np.testing.assert_array_equal(np.sort(np.asarray(pre), -1)[0], own[0, :16])
    np.testing.assert_array_equal(np.sort(np.asarray(pre), -1)[1, :11], own[1, :11])  # row 1: 11 valid tokens
    _, cache, step = decode_step(params, toks[:, 16], cfg, cache, return_routes=True)
    assert step.shape == (2, cfg.num_hidden_layers, cfg.num_experts_per_tok)
    np.testing.assert_array_equal(np.sort(np.asarray(step), -1)[0], own[0, 16])
