"""Training metrics: tensorboardX event files, `metrics.jsonl`, a tqdm bar, and the deferred device fetch.

`MetricsLogger` writes one JSON object per logged step (always with `step`) to RUN/metrics.jsonl and the same
scalars to RUN/tb/ (process 0 only). On resume, `truncate_after(step)` drops lines past the restored checkpoint and
the event writer is opened with `purge_step`, so TensorBoard discards the stale events of the killed run: the
files then read as if the run had never stopped.

`Deferred` holds the metrics of step t as device arrays and fetches them only after step t+1 has been dispatched,
so the host never waits on the device to log (nanodo's pattern); a non-finite loss is detected one step late.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from searchjax.atomic import atomic_write_text

PROGRESS_KEYS = ("loss", "lr", "grad_norm", "perf/tokens_per_s")


def _scalar(v: Any) -> float | int:
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"metric value of shape {a.shape} is not a scalar")
    x = a.reshape(()).item()
    return int(x) if isinstance(x, (bool, np.bool_)) else x


class MetricsLogger:
    """Scalars to metrics.jsonl + tensorboardX + a tqdm bar (everything on process 0 only)."""

    def __init__(self, run_dir: str | os.PathLike, total_steps: int, *, start_step: int = 0, resuming: bool = False,
                 progress: bool = True, desc: str = "train"):
        self.run_dir = Path(run_dir)
        self.main = jax.process_index() == 0
        self.path = self.run_dir / "metrics.jsonl"
        self._tb = None
        self._bar = None
        if not self.main:
            return
        if resuming:
            self.truncate_after(start_step)
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=start_step if resuming else None)
        self._file = self.path.open("a")
        if progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc=desc, dynamic_ncols=True)

    def truncate_after(self, step: int) -> None:
        """Keep only the lines with step <= `step` (what the restored checkpoint had logged), atomically."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # the line a kill -9 cut short
                continue
            if row["step"] <= step:
                kept.append(line + "\n")
        atomic_write_text(self.path, "".join(kept))

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, float]:
        """Write the scalars of `step` (device arrays are fetched here); returns them as Python numbers."""
        values = {k: _scalar(v) for k, v in jax.device_get(metrics).items()}
        if not self.main:
            return values
        self._file.write(json.dumps({"step": int(step), **values}, allow_nan=True) + "\n")
        self._file.flush()
        for k, v in values.items():
            self._tb.add_scalar(k, v, int(step))
        if self._bar is not None:
            shown = {k.split("/")[-1]: f"{values[k]:.4g}" for k in PROGRESS_KEYS if k in values}
            self._bar.set_postfix(shown, refresh=False)
        return values

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def close(self) -> None:
        if not self.main:
            return
        self._tb.flush()
        self._tb.close()
        self._file.close()
        if self._bar is not None:
            self._bar.close()


class Deferred:
    """Metrics of the previous step, fetched after the next step is dispatched (see module docstring)."""

    def __init__(self):
        self._pending: tuple[int, dict[str, Any], float] | None = None

    def push(self, step: int, metrics: dict[str, Any]) -> tuple[int, dict[str, float], float] | None:
        """Hold (step, metrics); return the previous pair fetched to host with its dispatch time, or None."""
        previous, self._pending = self._pending, (step, metrics, time.perf_counter())
        return None if previous is None else _fetch(previous)

    def flush(self) -> tuple[int, dict[str, float], float] | None:
        previous, self._pending = self._pending, None
        return None if previous is None else _fetch(previous)


def _fetch(item):
    step, metrics, t = item
    host = {k: _scalar(v) for k, v in jax.device_get(metrics).items()}
    loss = host.get("loss")
    if loss is not None and not math.isfinite(loss):
        raise FloatingPointError(f"step {step}: loss is {loss}; stopping before the state is saved")
    return step, host, t


class Timer:
    """Wall-clock seconds between `tick()` calls (the steady-state step time, compile excluded by the caller)."""

    def __init__(self):
        self._t = time.perf_counter()

    def tick(self) -> float:
        now = time.perf_counter()
        dt, self._t = now - self._t, now
        return dt
