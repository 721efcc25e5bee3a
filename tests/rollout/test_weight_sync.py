"""GRPO weight sync: trainer weights on one mesh go into an engine on another mesh (cast to its dtype), with no
recompilation, as new buffers (a donated trainer state never deletes them), and give the trainer's logits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax import model as M
from searchjax.rollout import RolloutDriver, Sampling, SearchJaxEngine
from searchjax.sharding import make_mesh


def _perturbed(params, scale=0.05):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(7), len(leaves))
    return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])


def _prefill_logits(engine, params, tokens):
    padded = np.zeros(64, np.int32)
    padded[: len(tokens)] = tokens
    return np.asarray(engine.prefill(params=params, padded_tokens=padded, true_length=len(tokens)).logits)[0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sync_from_an_fsdp_tensor_trainer_mesh_into_another_engine_mesh(cfg, params, tokenizer, dtype):
    assert jax.device_count() == 8
    trainer_mesh = make_mesh({"fsdp": 4, "tensor": 2})
    trained = jax.device_put(_perturbed(params), M.param_shardings(cfg, trainer_mesh))
    assert any(len(x.sharding.device_set) == 8 for x in jax.tree.leaves(trained))
    engine_mesh = make_mesh({"tensor": 2}, devices=jax.devices()[4:6])
    cast = lambda p: jax.tree.map(lambda x: x.astype(dtype), p)  # noqa: E731
    engine = SearchJaxEngine(cfg, cast(params), tokenizer, max_concurrent_decodes=2, max_prefill_length=64,
                             max_len=128, cache_dtype=dtype, sampling=Sampling(0.0), mesh=engine_mesh)
    driver = RolloutDriver(engine, cast(params))
    tokens = tokenizer.encode("The river Avon flows through the city of Bath.")[:40]
    before = _prefill_logits(engine, driver.params, tokens)
    traces = dict(engine.trace_counts)

    driver.set_params(driver.cast_like(trained), version=5)
    assert driver.version == 5
    assert dict(engine.trace_counts) == traces  # no recompilation
    for leaf in jax.tree.leaves(driver.params):
        assert leaf.dtype == jnp.dtype(dtype) and leaf.sharding.mesh.devices.tolist() == engine_mesh.devices.tolist()
    got = _prefill_logits(engine, driver.params, tokens)
    assert dict(engine.trace_counts) == traces
    # The trainer's own logits (its mesh, its float32 weights, cast like the engine's) at the last prompt token.
    want = np.asarray(M.forward(cast(trained), jnp.asarray([tokens], jnp.int32), cfg))[0, -1]
    tol = 1e-4 if dtype == "float32" else 0.1
    np.testing.assert_allclose(got, want, atol=tol, rtol=tol)
    assert np.abs(got - before).max() > 10 * tol  # the new weights are the ones in use

    # New buffers: deleting the trainer's arrays (as a donated step does) leaves the engine's weights intact.
    for leaf in jax.tree.leaves(trained):
        leaf.delete()
    np.testing.assert_allclose(_prefill_logits(engine, driver.params, tokens), got, atol=0, rtol=0)
