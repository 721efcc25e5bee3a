"""The supervised training loop shared by the SFT, LM-pretraining and reward-model stages.

Per step t (1-based after the update):

    batch   = next(iterator)                 host: Grain iterator (checkpointable)
    arrays  = prepare(batch)                 host → global device arrays, plus host-side counts (tokens, padding)
    state   = step_fn(state, arrays)         dispatched asynchronously; the old state is donated
    log t−1                                   its metrics are fetched only now, so the device never waits on the host
    eval    when t % eval_every == 0 or t is the last step
    save    when t % save_every == 0 or t is the last step (state + iterator + metadata at the same point)

A KeyboardInterrupt (Ctrl-C, or SIGTERM as the CLI delivers it) between steps saves the current state before the
loop exits, so a preempted run resumes where it stopped; a kill -9 resumes from the last saved step, with the same
data and PRNG stream (both are in the checkpoint).

Logged every `log_every` steps: the step's metrics (loss, lr, grad_norm, ...), perf/step_time_s, perf/tokens_per_s
(non-padding tokens), perf/mfu (model FLOPs/s ÷ peak_flops_per_device × devices), data/nonpad_frac and
timing_s/data (host time spent producing the batch); timing_s/first_step (compile included) once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax

from searchjax.train.checkpoint import Checkpointer
from searchjax.train.config import TrainConfig
from searchjax.train.metrics import Deferred, MetricsLogger
from searchjax.train.rundir import RunDir
from searchjax.train.state import TrainState

Prepared = tuple[dict[str, jax.Array], dict[str, float]]


@dataclasses.dataclass
class Loop:
    """Everything one run of `fit` needs besides the state (the stage builds it)."""

    cfg: TrainConfig
    run: RunDir
    step_fn: Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]
    iterator: Iterator[Any]
    prepare: Callable[[Any], Prepared]
    checkpointer: Checkpointer
    meta: dict[str, Any]
    flops: Callable[[dict[str, float]], float]
    evaluate: Callable[[TrainState], dict[str, float]] | None = None
    desc: str = "train"


def _due(step: int, every: int, last: int) -> bool:
    return step == last or (every > 0 and step % every == 0)


def _alive(state: TrainState) -> bool:
    return not any(x.is_deleted() for x in jax.tree.leaves(state) if isinstance(x, jax.Array))


def fit(loop: Loop, state: TrainState, start_step: int) -> tuple[TrainState, dict[str, float]]:
    """Train from `start_step` to `cfg.steps`; returns the final state and the last logged metrics."""
    cfg = loop.cfg
    logger = MetricsLogger(loop.run.root, cfg.steps, start_step=start_step, resuming=loop.run.resuming,
                           progress=cfg.progress, desc=loop.desc)
    deferred, last = Deferred(), {}
    peak = cfg.peak_flops_per_device * jax.device_count()
    timing = {"prev_done": None, "start": time.perf_counter()}
    step = start_step
    try:
        while step < cfg.steps:
            t0 = time.perf_counter()
            arrays, counts = loop.prepare(next(loop.iterator))
            data_s = time.perf_counter() - t0
            state, metrics = loop.step_fn(state, arrays)
            step += 1
            done = deferred.push(step, {**metrics, **counts, "timing_s/data": data_s})
            if done is not None:
                last = _log_done(loop, logger, done, timing, peak) or last
            if loop.evaluate is not None and _due(step, cfg.eval_every, cfg.steps):
                done = deferred.flush()
                if done is not None:
                    last = _log_done(loop, logger, done, timing, peak) or last
                ev = loop.evaluate(state) or None
                if ev:
                    logger.log(step, ev)
                    last = {**last, **ev}
                timing["prev_done"] = None  # the next step's time would include the evaluation
            else:
                ev = None
            if _due(step, cfg.save_every, cfg.steps):
                loop.checkpointer.save(step, state, loop.iterator, loop.meta, metrics=ev)
                timing["prev_done"] = None
        done = deferred.flush()
        if done is not None:
            last = _log_done(loop, logger, done, timing, peak) or last
        loop.checkpointer.wait()
    except KeyboardInterrupt:
        if _alive(state) and step > start_step and step not in loop.checkpointer.steps():
            print(f"\ninterrupted: saving step {step} to {loop.checkpointer.directory} before exiting", flush=True)
            loop.checkpointer.save(step, state, loop.iterator, loop.meta)
            loop.checkpointer.wait()
        raise
    finally:
        logger.close()
    return state, last


def _log_done(loop: Loop, logger: MetricsLogger, done, timing: dict, peak: float) -> dict[str, float] | None:
    """Log a fetched step (on the log cadence) with its timing figures; returns what was logged."""
    step, host, _ = done
    now = time.perf_counter()
    prev, timing["prev_done"] = timing["prev_done"], now
    if "start" in timing:  # the first step of this process: compilation included
        host["timing_s/first_step"] = now - timing.pop("start")
    step_time = None if prev is None else now - prev
    logger.advance()
    if not _due(step, loop.cfg.log_every, loop.cfg.steps):
        return None
    if step_time is not None:
        host["perf/step_time_s"] = step_time
        host["perf/tokens_per_s"] = host.get("data/tokens", 0.0) / step_time
        host["perf/mfu"] = loop.flops(host) / step_time / peak
    return logger.log(step, host)
