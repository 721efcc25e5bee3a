"""The optax chain of a training run, built from `OptimConfig` (formulas in its docstring).

    tx = clip_by_global_norm(clip_norm) → AdamW(lr(t), β1, β2, ε, weight_decay · mask_decay)   on trainable leaves
         set_to_zero                                                                          on frozen leaves

Gradient accumulation is not an optax wrapper here: `searchjax.train.step` scans over micro-batches inside one
jitted step and hands the accumulated gradient to `tx` once, so the optimizer sees exactly one update per step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from searchjax.train.config import OptimConfig


def lr_schedule(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
    """lr(t) as a function of the optimizer step t (0-based): warmup, then the configured decay to end_lr."""
    peak, end = cfg.learning_rate, cfg.learning_rate * cfg.end_lr_ratio
    decay_steps = max(1, total_steps - cfg.warmup_steps)
    if cfg.schedule == "cosine":
        decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=cfg.end_lr_ratio)
    elif cfg.schedule == "linear":
        decay = optax.linear_schedule(peak, end, decay_steps)
    else:
        decay = optax.constant_schedule(peak)
    if cfg.warmup_steps == 0:
        return decay
    warmup = optax.linear_schedule(0.0, peak, cfg.warmup_steps)
    return optax.join_schedules([warmup, decay], [cfg.warmup_steps])


def decay_mask(params: Any) -> Any:
    """True on leaves that get weight decay: matrices (rank ≥ 2); norms, biases and per-head scalars are exempt."""
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def make_optimizer(
    cfg: OptimConfig, total_steps: int, trainable: Any | Callable[[Any], Any] | None = None
) -> optax.GradientTransformation:
    """The run's optimizer. `trainable` is a bool pytree (or a function params -> bool pytree) matching params;
    frozen leaves get a zero update and no optimizer moments (None: everything trains)."""
    parts = []
    if cfg.clip_norm is not None:
        parts.append(optax.clip_by_global_norm(cfg.clip_norm))
    parts.append(optax.adamw(lr_schedule(cfg, total_steps), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                             weight_decay=cfg.weight_decay, mask=decay_mask))
    tx = optax.chain(*parts)
    if trainable is None:
        return tx
    label = (lambda p: jax.tree.map(lambda t: "train" if t else "freeze", trainable(p))) if callable(trainable) \
        else jax.tree.map(lambda t: "train" if t else "freeze", trainable)
    return optax.multi_transform({"train": tx, "freeze": optax.set_to_zero()}, label)
