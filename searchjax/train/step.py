"""One jitted, donated training step for any loss: `(state, batch) -> (state, metrics)`.

A loss is `loss_fn(params, batch, key) -> (loss, metrics)` over one micro-batch, where `metrics["weight"]` (default
1) is what that micro-batch's loss is a mean over (its token count for a token-mean loss). With k micro-batches
the step accumulates in a `lax.scan`

    g = Σ_k w_k ∇ℓ_k / Σ_k w_k,     ℓ = Σ_k w_k ℓ_k / Σ_k w_k

which for a token-mean loss is exactly the gradient and loss of the whole batch at once (tested ≤ 1e-6), then
applies one optimizer update. Every other metric is reported as the same weighted mean (a metric named *_max as
the maximum over micro-batches); `weight` as the sum.
The step also reports grad_norm (before clipping), update_norm, param_norm, lr and the global batch's counts
(`batch_stats`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from searchjax.sharding import logical_sharding
from searchjax.train.state import TrainState, step_key

LossFn = Callable[[Any, dict[str, jax.Array], jax.Array], tuple[jax.Array, dict[str, jax.Array]]]


def cast_for_compute(params: Any, dtype: str) -> Any:
    """Matrices (rank ≥ 2, floating) cast to the compute dtype; vectors (norms, per-head scalars) stay float32."""
    if dtype == "float32":
        return params
    dt = jnp.dtype(dtype)
    return jax.tree.map(lambda p: p.astype(dt) if jnp.ndim(p) >= 2 and jnp.issubdtype(p.dtype, jnp.floating)
                        else p, params)


def _split(batch: dict[str, jax.Array], k: int) -> dict[str, jax.Array]:
    def one(x):
        if x.shape[0] % k:
            raise ValueError(f"train step: batch of {x.shape[0]} rows does not split into {k} micro-batches")
        return x.reshape(k, x.shape[0] // k, *x.shape[1:])

    return jax.tree.map(one, batch)


def accumulate(loss_fn: LossFn, params: Any, batch: dict[str, jax.Array], key: jax.Array, micro_batches: int,
               compute_dtype: str = "float32") -> tuple[Any, jax.Array, dict[str, jax.Array]]:
    """(gradient, loss, metrics) of the whole batch through `micro_batches` sequential micro-batches (see module
    docstring). Usable on its own (tests, benchmarks) or inside `make_train_step`."""

    def weighted(p, mb, k):
        loss, metrics = loss_fn(cast_for_compute(p, compute_dtype), mb, k)
        w = jnp.asarray(metrics.get("weight", 1.0), jnp.float32)
        return loss * w, (loss, w, metrics)

    grad_fn = jax.grad(weighted, has_aux=True)
    if micro_batches == 1:
        g, (loss, w, metrics) = grad_fn(params, batch, key)
        scale = 1.0 / jnp.maximum(w, 1e-30)
        metrics = {**metrics, "weight": w}
        return jax.tree.map(lambda x: x * scale, g), loss, metrics

    parts = _split(batch, micro_batches)
    keys = jax.random.split(key, micro_batches)

    def body(carry, xs):
        g_acc, l_acc, w_acc, m_acc = carry
        mb, k = xs
        g, (loss, w, metrics) = grad_fn(params, mb, k)
        v32 = {n: jnp.asarray(v, jnp.float32) for n, v in metrics.items() if n != "weight"}
        m = {n: jnp.maximum(m_acc[n], v) if _is_max(n) else m_acc[n] + v * w for n, v in v32.items()}
        g_acc = jax.tree.map(jnp.add, g_acc, g)
        return (g_acc, l_acc + loss * w, w_acc + w, m), None

    _, (_, _, shapes) = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], parts), keys[0])
    m0 = {n: jnp.full(v.shape, -jnp.inf if _is_max(n) else 0.0, jnp.float32) for n, v in shapes.items()
          if n != "weight"}
    g0 = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32 if jnp.issubdtype(p.dtype, jnp.floating)
                                          else p.dtype), params)
    (g, l_sum, w_sum, m_sum), _ = jax.lax.scan(body, (g0, 0.0, 0.0, m0), (parts, keys))
    scale = 1.0 / jnp.maximum(w_sum, 1e-30)
    grads = jax.tree.map(lambda x, p: (x * scale).astype(p.dtype), g, params)
    metrics = {n: v if _is_max(n) else v * scale for n, v in m_sum.items()}
    metrics["weight"] = w_sum
    return grads, l_sum * scale, metrics


def _is_max(name: str) -> bool:
    """Metrics named *_max combine over micro-batches by max, every other one as the weighted mean."""
    return name.endswith("_max")


def batch_stats(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Counts of the global batch, computed on device (so every process logs the same, global figures):
    data/rows, data/width, data/tokens (real tokens: Σ lengths), data/nonpad_frac, data/loss_tokens (Σ loss_mask)."""
    out: dict[str, jax.Array] = {}
    if "input_ids" in batch and "lengths" in batch:
        rows, width = batch["input_ids"].shape
        tokens = batch["lengths"].sum().astype(jnp.float32)
        out.update({"data/rows": jnp.float32(rows), "data/width": jnp.float32(width), "data/tokens": tokens,
                    "data/nonpad_frac": tokens / (rows * width)})
    if "loss_mask" in batch:
        out["data/loss_tokens"] = batch["loss_mask"].sum().astype(jnp.float32)
    return out


def make_train_step(
    loss_fn: LossFn,
    tx: optax.GradientTransformation,
    *,
    micro_batches: int = 1,
    compute_dtype: str = "float32",
    lr_fn: optax.Schedule | None = None,
    state_shardings: TrainState | None = None,
    mesh: Mesh | None = None,
) -> Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]:
    """The jitted step; the state argument is donated (its buffers are reused for the new state).

    With `state_shardings` and `mesh` the output state keeps exactly the input layout and metrics come back
    replicated; the batch's sharding is taken from the arrays passed in (see `device_batch`).
    """

    def step(state: TrainState, batch: dict[str, jax.Array]):
        grads, loss, metrics = accumulate(loss_fn, state.params, batch, step_key(state), micro_batches,
                                          compute_dtype)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        out = {**metrics, **batch_stats(batch), "loss": loss, "grad_norm": optax.global_norm(grads),
               "update_norm": optax.global_norm(updates), "param_norm": optax.global_norm(params)}
        if lr_fn is not None:
            out["lr"] = jnp.asarray(lr_fn(state.step), jnp.float32)
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state, rng=state.rng), out

    if state_shardings is None or mesh is None:
        return jax.jit(step, donate_argnums=(0,))
    rep = NamedSharding(mesh, PartitionSpec())
    return jax.jit(step, donate_argnums=(0,), out_shardings=(state_shardings, rep))


def batch_sharding(mesh: Mesh, shape: tuple[int, ...]) -> NamedSharding:
    """Rows of a global array of `shape` over the mesh's batch axes (the logical "batch" rule, dropping axes that
    do not divide the rows), everything else replicated."""
    return logical_sharding(mesh, ("batch",) + (None,) * (len(shape) - 1), shape)


def device_batch(batch: dict[str, Any], mesh: Mesh) -> dict[str, jax.Array]:
    """This process's rows of a global batch as global jax.Arrays sharded on the batch axes.

    Each process passes only its own rows (its shard of the data); under one process this is a device_put.
    """
    procs = jax.process_count()
    out = {}
    for name, x in batch.items():
        sharding = batch_sharding(mesh, (x.shape[0] * procs, *x.shape[1:]))
        out[name] = jax.make_array_from_process_local_data(sharding, x)
    return out
