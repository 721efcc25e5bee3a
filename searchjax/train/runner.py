"""What every supervised stage does around its loss: mesh, state (fresh or restored), step, loop, export.

    mesh      = make_mesh(cfg.mesh)                                       (all processes' devices)
    state     = restore(newest checkpoint) if RUN has one, else create_state(init_params(), tx)
    step_fn   = make_train_step(loss_fn, tx, micro_batches, compute_dtype)  (jitted, donated)
    fit(...)  → RUN/final via `export(params)`

A stage supplies the abstract params and their shardings (so a restore never materialises the starting
checkpoint), a function that produces the starting params, its loss, its data iterator and batch preparation,
and its export; the rest is here once.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from searchjax.atomic import atomic_path, atomic_write_text
from searchjax.config import to_dict
from searchjax.sharding import make_mesh
from searchjax.train.checkpoint import Checkpointer
from searchjax.train.config import TrainConfig
from searchjax.train.loop import Loop, Prepared, fit
from searchjax.train.optim import lr_schedule, make_optimizer
from searchjax.train.rundir import RunDir
from searchjax.train.state import abstract_state, create_state
from searchjax.train.step import LossFn, device_batch, make_train_step


def run_mesh(cfg: TrainConfig) -> Mesh:
    """The run's mesh over every process's devices (cfg.mesh; empty = all devices on fsdp)."""
    return make_mesh(cfg.mesh or None)


@dataclasses.dataclass
class Supervised:
    """A stage's parts (see module docstring). `prepare` turns a host batch into (device arrays, host counts)."""

    stage: str
    cfg: TrainConfig
    run: RunDir
    mesh: Mesh
    abstract_params: Any
    param_shardings: Any
    init_params: Callable[[], Any]
    loss_fn: LossFn
    iterator: Iterator[Any]
    prepare: Callable[[Any], Prepared]
    flops: Callable[[dict[str, float]], float]
    export: Callable[[Any, Path], None]
    evaluate: Callable[[Any], dict[str, float]] | None = None
    trainable: Any = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


def host_prepare(mesh: Mesh, keys: tuple[str, ...],
                 counts: Callable[[dict[str, Any]], dict[str, float]] | None = None):
    """A `prepare` that ships the named numpy arrays of this process's rows of a batch to the mesh, with optional
    host-side `counts(batch)` of those rows (the step counts the global batch itself:
    `searchjax.train.step.batch_stats`)."""

    def prepare(batch: dict[str, Any]) -> Prepared:
        return device_batch({k: batch[k] for k in keys}, mesh), ({} if counts is None else counts(batch))

    return prepare


def run_supervised(s: Supervised) -> dict[str, Any]:
    """Train the stage to cfg.steps (resuming when RUN holds a checkpoint), export RUN/final; returns a summary
    (also written to RUN/summary.json)."""
    cfg = s.cfg
    tx = make_optimizer(cfg.optim, cfg.steps, s.trainable)
    ckpt = Checkpointer(s.run.checkpoints, cfg.checkpoint)
    meta = {"stage": s.stage, "config": to_dict(cfg), "process_count": jax.process_count(), **s.meta}
    restored = ckpt.restore(abstract_state(tx, s.abstract_params, s.param_shardings, s.mesh), s.iterator) \
        if s.run.resuming else None
    if restored is not None:
        start, state, saved = restored
        if saved.get("process_count", 1) != jax.process_count():
            raise ValueError(f"{s.run.checkpoints}: saved by {saved.get('process_count')} processes, resumed by "
                             f"{jax.process_count()}; the data iterator state is per process: resume with the same "
                             "process count")
        print(f"{s.stage}: resuming {s.run.root} from step {start}", flush=True)
    else:
        start, state = 0, create_state(s.init_params(), tx, cfg.seed, s.mesh, s.param_shardings)
    step_fn = make_train_step(s.loss_fn, tx, micro_batches=cfg.optim.micro_batches,
                              compute_dtype=cfg.compute_dtype, lr_fn=lr_schedule(cfg.optim, cfg.steps),
                              state_shardings=jax.tree.map(lambda x: x.sharding, state), mesh=s.mesh)
    t0 = time.perf_counter()
    loop = Loop(cfg=cfg, run=s.run, step_fn=step_fn, iterator=s.iterator, prepare=s.prepare, checkpointer=ckpt,
                meta=meta, flops=s.flops, evaluate=s.evaluate, desc=s.stage)
    try:
        state, last = fit(loop, state, start)
    finally:
        ckpt.close()
    train_s = time.perf_counter() - t0
    export_final(s, state.params)
    summary = {"stage": s.stage, "steps": cfg.steps, "resumed_from": start, "train_s": round(train_s, 2),
               "final": str(s.run.final), "last_metrics": last}
    if jax.process_index() == 0:
        atomic_write_text(s.run.root / "summary.json", json.dumps(summary, indent=2, default=float) + "\n")
    return summary


def host_params(params: Any) -> Any:
    """The params as numpy arrays on this host (gathered from every process when they are spread over several)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return multihost_utils.process_allgather(params, tiled=True)
    return jax.tree.map(np.asarray, params)


def export_final(s: Supervised, params: Any) -> None:
    """RUN/final written whole and atomically by `s.export` (process 0; every process joins the gather)."""
    export_final_params(s.run.final, params, s.export)


def export_final_params(final: Path, params: Any, export: Callable[[Any, Path], None]) -> None:
    """`final` written whole and atomically by `export(params, directory)` (process 0; every process joins the
    gather)."""
    gathered = host_params(params)
    if jax.process_index() != 0:
        return
    with atomic_path(final) as tmp:
        tmp.mkdir()
        export(gathered, tmp)
