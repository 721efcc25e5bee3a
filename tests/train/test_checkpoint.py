"""Checkpoints: state + Grain iterator round trip, preservation (newest N, best), corrupt-newest fallback."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.data.lm import lm_dataset
from searchjax.sharding import make_mesh
from searchjax.train.checkpoint import Checkpointer
from searchjax.train.config import CheckpointConfig, OptimConfig
from searchjax.train.optim import make_optimizer
from searchjax.train.state import abstract_state, create_state


def _toy(mesh):
    params = {"w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4), "b": jnp.ones((4,), jnp.float32)}
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    shardings = {"w": rep, "b": rep}
    tx = make_optimizer(OptimConfig(learning_rate=0.1), 10)
    return params, shardings, tx


def _iterator():
    rows = np.arange(40 * 9, dtype=np.int32).reshape(40, 9)
    return iter(lm_dataset(rows, 4, seed=0, process_index=0, process_count=1).to_iter_dataset())


def test_round_trip_state_and_iterator(tmp_path):
    mesh = make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
    params, shardings, tx = _toy(mesh)
    state = create_state(params, tx, 7, mesh, shardings)
    it = _iterator()
    for _ in range(3):
        next(it)
    ck = Checkpointer(tmp_path / "ck", CheckpointConfig(keep=2))
    ck.save(3, state, it, {"stage": "test"})
    ck.wait()
    expected = next(it)  # what the uninterrupted run reads next
    fresh = _iterator()
    step, restored, meta = ck.restore(abstract_state(tx, jax.eval_shape(lambda: params), shardings, mesh), fresh)
    assert step == 3 and meta["stage"] == "test" and meta["step"] == 3
    np.testing.assert_array_equal(next(fresh)["input_ids"], expected["input_ids"])
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert restored.params["w"].sharding == shardings["w"]
    ck.close()


def test_keeps_newest_and_best(tmp_path):
    mesh = make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
    params, shardings, tx = _toy(mesh)
    state = create_state(params, tx, 0, mesh, shardings)
    it = _iterator()
    ck = Checkpointer(tmp_path / "ck", CheckpointConfig(keep=2, best_metric="dev/loss", best_mode="min"))
    losses = {1: 5.0, 2: 1.0, 3: 4.0, 4: 3.0, 5: 6.0}
    for step, loss in losses.items():
        ck.save(step, state, it, {}, metrics={"dev/loss": loss})
        ck.wait()
    assert ck.steps() == [2, 4, 5]  # the best (step 2, lowest loss) and the newest two
    ck.close()


def test_corrupt_newest_falls_back_with_message(tmp_path, capsys):
    mesh = make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
    params, shardings, tx = _toy(mesh)
    state = create_state(params, tx, 0, mesh, shardings)
    it = _iterator()
    ck = Checkpointer(tmp_path / "ck", CheckpointConfig(keep=3))
    for step in (1, 2):
        next(it)
        ck.save(step, state, it, {"n": step})
        ck.wait()
    ck.close()
    for f in (tmp_path / "ck" / "2" / "state").rglob("*"):
        if f.is_file() and f.stat().st_size > 0 and "metadata" not in f.name:
            f.write_bytes(b"\x00garbage" * 3)
    ck = Checkpointer(tmp_path / "ck", CheckpointConfig(keep=3))
    abstract = abstract_state(tx, jax.eval_shape(lambda: params), shardings, mesh)
    step, _, meta = ck.restore(abstract, _iterator())
    out = capsys.readouterr().out
    assert step == 1 and meta["n"] == 1
    assert "checkpoint step 2" in out and "restored step 1" in out, out
    assert ck.steps() == [1]
    assert any((tmp_path / "ck.corrupt").iterdir())
    ck.close()


def test_nothing_to_restore(tmp_path):
    mesh = make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
    params, shardings, tx = _toy(mesh)
    ck = Checkpointer(tmp_path / "ck")
    assert ck.restore(abstract_state(tx, jax.eval_shape(lambda: params), shardings, mesh), _iterator()) is None
    ck.close()


def test_zero_size_leaves_round_trip(tmp_path):
    """A model config with no layer of one type has empty stacks, which orbax alone refuses to save."""
    mesh = make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
    params, shardings, tx = _toy(mesh)
    params = {**params, "empty": jnp.zeros((0, 4), jnp.float32)}
    shardings = {**shardings, "empty": shardings["w"]}
    state = create_state(params, tx, 7, mesh, shardings)
    it = _iterator()
    ck = Checkpointer(tmp_path / "ck", CheckpointConfig(keep=2))
    ck.save(1, state, it, {})
    ck.wait()
    abstract = abstract_state(tx, jax.eval_shape(lambda: params), shardings, mesh)
    _, restored, _ = ck.restore(abstract, _iterator())
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        assert a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert restored.params["empty"].sharding == shardings["empty"]
    assert ck.restore_state(1, abstract).params["empty"].shape == (0, 4)
    ck.close()
