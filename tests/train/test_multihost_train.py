"""SFT over 2 CPU processes (loopback, `jax.distributed`) ≡ 1 process with the same global batch, the dev
evaluation included (per shard across CPU processes: `searchjax.train.step.eval_fn`); the checkpoint the
2-process run writes restores in one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.train.conftest import read_metrics

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "train" / "sft_tiny.yaml"
ARGS = ["steps=3", "batch_size=4", "data.max_len=1024", "data.buckets=[512,1024]", "data.window_batches=2",
        "eval_every=3", "data.eval_batches=1", "save_every=3", "log_every=1", "progress=false", "checkpoint.async_save=false"]


def _cmd(ws, out, dev, *extra):
    return [sys.executable, "-m", "searchjax.cli.main", "train", "sft", "--config", str(CONFIG), "--model",
            str(ws["model"]), "--data", str(ws["sft"]), "--dev", str(dev), "--out", str(out), *ARGS, *extra]


def _short_dev(ws, path: Path) -> Path:
    """The 4 shortest conversations as the dev file: they fit max_len with their assistant turns (the one split
    dev row of the workspace is cut before them)."""
    lines = sorted(ws["sft"].read_text().splitlines(), key=len)[:4]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_two_processes_match_one(workspace, tmp_path):
    import portpicker

    one, dev = tmp_path / "one", _short_dev(workspace, tmp_path / "dev.jsonl")
    # One device: the in-process rendezvous of 2 fake devices times out (40 s) on a loaded 2-core machine.
    env1 = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    r = subprocess.run(_cmd(workspace, one, dev), env=env1, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]

    two = tmp_path / "two"
    port = portpicker.pick_unused_port()
    env2 = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")  # one device per process: 2 in the mesh
    procs = [subprocess.Popen(_cmd(workspace, two, dev, "distributed.num_processes=2", f"distributed.process_id={i}",
                                   f"distributed.coordinator_address=127.0.0.1:{port}"),
                              env=env2, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=1200) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]

    a, b = read_metrics(one), read_metrics(two)
    dev_a, dev_b = ([r for r in rows if "dev/loss" in r] for rows in (a, b))
    assert [r["step"] for r in dev_a] == [r["step"] for r in dev_b] == [3]
    np.testing.assert_allclose(dev_b[0]["dev/loss"], dev_a[0]["dev/loss"], rtol=1e-5)
    a, b = ([r for r in rows if "loss" in r] for rows in (a, b))
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b):
        assert ra["data/width"] == rb["data/width"] and ra["data/tokens"] == rb["data/tokens"]
        np.testing.assert_allclose(rb["loss"], ra["loss"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(rb["grad_norm"], ra["grad_norm"], rtol=1e-5, atol=1e-5)

    # The 2-process checkpoint, read back in this single process.
    import jax

    from searchjax.model import load_hf, param_shardings
    from searchjax.sharding import make_mesh
    from searchjax.train.checkpoint import Checkpointer
    from searchjax.train.config import OptimConfig
    from searchjax.train.optim import make_optimizer
    from searchjax.train.state import abstract_state

    cfg, final = load_hf(two / "final")
    mesh = make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
    tx = make_optimizer(OptimConfig(learning_rate=3e-3, warmup_steps=5, weight_decay=0.01), 3)
    abstract = abstract_state(tx, jax.eval_shape(lambda: final), param_shardings(cfg, mesh), mesh)
    ck = Checkpointer(two / "checkpoints")
    state = ck.restore_state(3, abstract)
    ck.close()
    assert int(state.step) == 3
    for x, y in zip(jax.tree.leaves(state.params), jax.tree.leaves(final)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
