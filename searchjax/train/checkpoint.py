"""Checkpoints of a training run: train state + Grain iterator + JSON metadata, saved together by orbax.

    RUN/checkpoints/<step>/state   the TrainState (orbax StandardSave: sharded arrays, one file set per step)
    RUN/checkpoints/<step>/data    the Grain iterator state (one file per process: resume with the same count)
    RUN/checkpoints/<step>/meta    JSON: the resolved config, the step, the stage name, free-form extras

Orbax writes every step into a temporary directory and renames it when all items are complete, so a kill at any
moment (also during an asynchronous save) leaves either the new step or nothing; `latest_step` only sees committed
steps. Restore takes the newest step; if that one cannot be read (a corrupt file), it is moved aside to
RUN/checkpoints.corrupt/ with a message naming it and the step restored instead, and the previous step is used.
Restore goes straight into the target shardings (`abstract_state` carries them), never through a full host copy.
Preservation: the newest `keep` steps, plus the `keep_best` best by `best_metric` when one is configured.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp

from searchjax.train.config import CheckpointConfig

log = logging.getLogger(__name__)
ITEMS = ("state", "data", "meta")


class CheckpointRestoreError(ValueError):
    """No checkpoint of a run directory could be restored; the message lists each step and why."""


def _policy(cfg: CheckpointConfig):
    cp = ocp.checkpoint_managers
    policies = [cp.LatestN(n=cfg.keep)]
    if cfg.best_metric is not None:
        name = cfg.best_metric
        # BestN keeps the last n of the sorted order: ascending keeps the largest values, descending the smallest.
        policies.append(cp.BestN(get_metric_fn=lambda m: float(m[name]), reverse=cfg.best_mode == "min",
                                 n=cfg.keep_best, keep_checkpoints_without_metrics=False))
    return cp.AnyPreservationPolicy(policies)


def _without_empty(tree: Any) -> Any:
    """The tree with its zero-size arrays left out (None): orbax refuses to save them, and a model config with no
    layer of one type (full_attention_interval 1: no DeltaNet layer) has empty stacks."""
    return jax.tree.map(lambda x: None if 0 in getattr(x, "shape", (1,)) else x, tree)


def _with_empty(abstract: Any, restored: Any) -> Any:
    """`restored` (a `_without_empty` tree) with the zero-size leaves of `abstract` put back, in their shardings."""
    leaves, treedef = jax.tree.flatten(abstract)
    it = iter(jax.tree.leaves(restored))
    full = [jax.device_put(np.zeros(x.shape, x.dtype), x.sharding) if 0 in getattr(x, "shape", (1,)) else next(it)
            for x in leaves]
    return jax.tree.unflatten(treedef, full)


class Checkpointer:
    """Save / restore of (state, data iterator, metadata) under one directory (see module docstring)."""

    def __init__(self, directory: str | os.PathLike, cfg: CheckpointConfig = CheckpointConfig()):
        self.directory = Path(directory).absolute()
        self.cfg = cfg
        options = ocp.CheckpointManagerOptions(
            enable_async_checkpointing=cfg.async_save, preservation_policy=_policy(cfg), create=True,
            cleanup_tmp_directories=True,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

    def steps(self) -> list[int]:
        """Committed steps, oldest first."""
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: Any, data_iterator: Any, meta: dict[str, Any],
             metrics: dict[str, float] | None = None) -> None:
        """Start saving `step` (asynchronously when configured). The arrays are copied to host before this
        returns, so the caller may donate `state` to the next step right away."""
        if self.cfg.best_metric is not None and metrics is not None and self.cfg.best_metric not in metrics:
            metrics = None  # a save without the ranking metric (e.g. the final step when no eval ran)
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(_without_empty(state)),
            data=grain.checkpoint.CheckpointSave(data_iterator),
            meta=ocp.args.JsonSave({**meta, "step": int(step)}),
        )
        self.manager.save(int(step), args=args, metrics=metrics, force=True)

    def wait(self) -> None:
        """Block until any asynchronous save has committed."""
        self.manager.wait_until_finished()

    def restore(self, abstract_state: Any, data_iterator: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """(step, state, meta) of the newest readable checkpoint, the data iterator set to its position; None when
        the directory holds no checkpoint. Unreadable newer steps are moved aside (module docstring)."""
        failures: list[tuple[int, str]] = []
        for step in reversed(self.steps()):
            try:
                out = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(_without_empty(abstract_state)),
                    data=grain.checkpoint.CheckpointRestore(data_iterator),
                    meta=ocp.args.JsonRestore(),
                ))
            except Exception as e:  # noqa: BLE001 - any unreadable step falls back to the previous one
                failures.append((step, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
                continue
            for bad, reason in failures:
                moved = self._quarantine(bad)
                msg = (f"checkpoint step {bad} ({self.directory / str(bad)}) is unreadable ({reason}); moved it to "
                       f"{moved} and restored step {step} ({self.directory / str(step)}) instead")
                log.warning(msg)
                if jax.process_index() == 0:
                    print(f"warning: {msg}", flush=True)
            if failures:
                self.manager.reload()
            return step, _with_empty(abstract_state, out["state"]), dict(out["meta"])
        if failures:
            listed = "; ".join(f"step {s}: {r}" for s, r in failures)
            raise CheckpointRestoreError(f"{self.directory}: no checkpoint could be restored ({listed})")
        return None

    def restore_state(self, step: int, abstract_state: Any) -> Any:
        """Only the train state of `step` (no data iterator): usable by any process count, e.g. to read in one
        process what a multi-process run saved."""
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(_without_empty(abstract_state))))
        return _with_empty(abstract_state, out["state"])

    def _quarantine(self, step: int) -> Path:
        src = self.directory / str(step)
        dst = self.directory.with_name(self.directory.name + ".corrupt") / f"{step}-{int(time.time())}"
        if jax.process_index() == 0 and src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src), str(dst))
        return dst

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
