"""The jitted train step: micro-batch accumulation ≡ one batch, memorisation, sharded ≡ unsharded, bf16 compute."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.model import param_shardings
from searchjax.sharding import make_mesh
from searchjax.testing.models import tiny_model
from searchjax.train.causal import next_token_loss
from searchjax.train.config import OptimConfig
from searchjax.train.optim import lr_schedule, make_optimizer
from searchjax.train.state import create_state
from searchjax.train.step import accumulate, device_batch, make_train_step


def _batch(rows: int, seq: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, (rows, seq)).astype(np.int32)
    lengths = rng.integers(seq // 2, seq + 1, rows)
    mask = (np.arange(seq)[None] < lengths[:, None] - 1).astype(np.int32)
    mask[:, : seq // 4] = 0  # a "prompt" part without loss, as in SFT
    targets = np.roll(ids, -1, axis=1)
    return {"input_ids": ids, "targets": targets, "loss_mask": mask, "lengths": lengths.astype(np.int32)}


def _setup(micro_batches=1, lr=1e-2, steps=10, mesh_shape=None, compute_dtype="float32", aux=0.0, eps=1e-8):
    cfg, params = tiny_model()
    mesh = make_mesh(mesh_shape or {"fsdp": 1}, devices=jax.devices()[: int(np.prod(list((mesh_shape or {"fsdp": 1}).values())))])
    shardings = param_shardings(cfg, mesh)
    params = jax.device_put(params, shardings)
    ocfg = OptimConfig(learning_rate=lr, warmup_steps=0, schedule="constant", micro_batches=micro_batches, eps=eps)
    tx = make_optimizer(ocfg, steps)
    state = create_state(params, tx, 0, mesh, shardings)
    loss = next_token_loss(cfg, remat=False, chunk=64, aux_coef=aux)
    step = make_train_step(loss, tx, micro_batches=micro_batches, compute_dtype=compute_dtype,
                           lr_fn=lr_schedule(ocfg, steps), state_shardings=jax.tree.map(lambda x: x.sharding, state),
                           mesh=mesh)
    return cfg, mesh, state, step, loss


def test_micro_batches_equal_one_batch():
    """k micro-batches of a token-mean loss give the gradient and loss of the whole batch (≤ 1e-6)."""
    cfg, params = tiny_model()
    loss = next_token_loss(cfg, remat=False, chunk=64, aux_coef=0.0)
    batch = jax.tree.map(jnp.asarray, _batch(8, 32, cfg.vocab_size))
    key = jax.random.key(0)
    g1, l1, m1 = jax.jit(lambda p, b: accumulate(loss, p, b, key, 1))(params, batch)
    g4, l4, m4 = jax.jit(lambda p, b: accumulate(loss, p, b, key, 4))(params, batch)
    assert float(m1["weight"]) == float(m4["weight"]) == float(batch["loss_mask"].sum())
    np.testing.assert_allclose(float(l4), float(l1), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g4)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
    scale = max(float(jnp.abs(x).max()) for x in jax.tree.leaves(g1))
    worst = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g4)))
    assert worst <= 1e-6 * max(1.0, scale)


def test_memorises_one_batch():
    cfg, mesh, state, step, _ = _setup(lr=1e-2, steps=150)
    batch = device_batch(_batch(2, 16, cfg.vocab_size, seed=3), mesh)  # the shape of the tests below: one compile
    first = None
    for _ in range(150):
        state, m = step(state, batch)
        first = float(m["loss"]) if first is None else first
    assert first > 4.0
    assert float(m["loss"]) < 0.05, float(m["loss"])
    assert int(state.step) == 150
    for name in ("grad_norm", "update_norm", "param_norm", "lr", "nll", "router_aux", "weight"):
        assert name in m


def test_state_is_donated():
    cfg, mesh, state, step, _ = _setup()
    old = state
    state, _ = step(state, device_batch(_batch(2, 16, cfg.vocab_size), mesh))
    assert old.params.embed.is_deleted()
    assert not state.params.embed.is_deleted()


@pytest.mark.slow
def test_sharded_step_equals_unsharded():
    """The same 3 steps on 8 fake devices (fsdp 4 × tensor 2) and on one device: loss and gradient norm of the
    first step to 1e-5, of every step to 1e-4; parameters to 2e-4 absolute. Adam's ε is 1e-3 here: with the
    default 1e-8 an entry whose gradient is ~0 gets g/√v = ±1, so reduction-order noise decides the sign of a
    whole lr = 1e-2 step and the parameters of the two runs differ by chance, not by a sharding error."""
    assert len(jax.devices()) >= 8, "tests/conftest.py sets 8 fake CPU devices"
    batch = _batch(8, 32, 256, seed=1)
    runs = []
    for shape in ({"fsdp": 1}, {"fsdp": 4, "tensor": 2}):
        cfg, mesh, state, step, _ = _setup(mesh_shape=shape, aux=1e-3, eps=1e-3)
        figures = []
        for _ in range(3):
            state, m = step(state, device_batch(batch, mesh))
            figures += [float(m["loss"]), float(m["grad_norm"])]
        runs.append((figures, jax.tree.map(np.asarray, state.params)))
    # Step 1 starts from identical params: only the reduction order differs. Later steps start from params that
    # already differ by that noise.
    np.testing.assert_allclose(runs[1][0][:2], runs[0][0][:2], rtol=1e-5)
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=1e-4)
    for a, b in zip(jax.tree.leaves(runs[0][1]), jax.tree.leaves(runs[1][1])):
        np.testing.assert_allclose(b, a, rtol=0, atol=2e-4)


def test_bf16_compute_keeps_float32_master_weights():
    cfg, mesh, state, step, _ = _setup(compute_dtype="bfloat16")
    batch = device_batch(_batch(2, 16, cfg.vocab_size), mesh)
    state, m = step(state, batch)
    assert state.params.embed.dtype == jnp.float32
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.opt_state) if jnp.issubdtype(x.dtype, jnp.floating))
    assert np.isfinite(float(m["loss"]))


def test_create_state_does_not_alias_the_callers_params():
    cfg, mesh, state, step, _ = _setup()
    params = jax.tree.map(lambda x: x + 0, state.params)
    from searchjax.train.state import create_state

    fresh = create_state(params, make_optimizer(OptimConfig(), 10), 0, mesh, jax.tree.map(lambda x: x.sharding, params))
    fresh, _ = step(fresh, device_batch(_batch(2, 16, cfg.vocab_size), mesh))
    assert not params.embed.is_deleted()  # the donated step consumed the state's copy, not the caller's arrays


def test_eval_fn_per_shard_equals_the_partitioned_call_without_collectives_in_control_flow():
    """The dev evaluations across CPU processes (`eval_fn`): per batch shard, sums added and rows concatenated,
    equal to the partitioner's split of the same call on 2 devices, with no collective inside the model's
    control flow (what XLA:CPU would start out of order across processes)."""
    from searchjax.model import forward, init_params, load_preset
    from searchjax.train.step import eval_fn
    from tests.train.test_multihost_grpo import collectives_in_control_flow

    cfg = load_preset("tiny").replace(num_hidden_layers=2, layer_types=("linear_attention", "full_attention"))
    mesh = make_mesh({"fsdp": 2}, devices=jax.devices()[:2])
    params = jax.device_put(init_params(cfg, jax.random.key(0)), param_shardings(cfg, mesh))
    batch = device_batch(_batch(8, 32, cfg.vocab_size), mesh)
    loss_fn = next_token_loss(cfg, remat=False, chunk=64, aux_coef=0.0)

    def sums(p, b):
        loss, m = loss_fn(p, b, None)
        return loss * m["weight"], m["weight"]

    def rows(p, b):
        return forward(p, b["input_ids"], cfg)[:, -1].max(-1)

    for fn, combine in ((sums, "sum"), (rows, "rows")):
        plain = eval_fn(fn, mesh, combine=combine, explicit_shards=False)
        shard = eval_fn(fn, mesh, combine=combine, explicit_shards=True)
        assert collectives_in_control_flow(shard.for_rows(8).lower(params, batch).compile().as_text()) == 0
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), shard(params, batch),
                     plain(params, batch))
    with pytest.raises(ValueError, match="combine"):
        eval_fn(sums, mesh, combine="mean")
