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

Across CPU processes the loss and its gradient run per batch shard (`sharded_accumulate`, see
`shards_explicitly`): each shard is one more level of the same micro-batch sums, added over the shards, so a
P-process step equals the 1-process step with P·k micro-batches (rows in process order). The parameters are
gathered whole for that part of the step. `eval_fn` does the same for the dev evaluations (a forward only).
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


def _sums(loss_fn: LossFn, params: Any, batch: dict[str, jax.Array], key: jax.Array, micro_batches: int,
          compute_dtype: str) -> tuple[Any, jax.Array, jax.Array, dict[str, jax.Array]]:
    """(Σ_k w_k ∇ℓ_k, Σ_k w_k ℓ_k, Σ_k w_k, metrics as Σ_k w_k m_k or, for *_max, max_k m_k) over the
    micro-batches of `batch` (a scan when there are several)."""

    def weighted(p, mb, k):
        loss, metrics = loss_fn(cast_for_compute(p, compute_dtype), mb, k)
        w = jnp.asarray(metrics.get("weight", 1.0), jnp.float32)
        return loss * w, (loss, w, metrics)

    def metric_sums(metrics, w):
        v32 = {n: jnp.asarray(v, jnp.float32) for n, v in metrics.items() if n != "weight"}
        return {n: v if _is_max(n) else v * w for n, v in v32.items()}

    grad_fn = jax.grad(weighted, has_aux=True)
    if micro_batches == 1:
        g, (loss, w, metrics) = grad_fn(params, batch, key)
        return g, loss * w, w, metric_sums(metrics, w)

    parts = _split(batch, micro_batches)
    keys = jax.random.split(key, micro_batches)

    def body(carry, xs):
        g_acc, l_acc, w_acc, m_acc = carry
        mb, k = xs
        g, (loss, w, metrics) = grad_fn(params, mb, k)
        m = {n: jnp.maximum(m_acc[n], v) if _is_max(n) else m_acc[n] + v for n, v in metric_sums(metrics, w).items()}
        g_acc = jax.tree.map(jnp.add, g_acc, g)
        return (g_acc, l_acc + loss * w, w_acc + w, m), None

    _, (_, _, shapes) = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], parts), keys[0])
    m0 = {n: jnp.full(v.shape, -jnp.inf if _is_max(n) else 0.0, jnp.float32) for n, v in shapes.items()
          if n != "weight"}
    g0 = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32 if jnp.issubdtype(p.dtype, jnp.floating)
                                          else p.dtype), params)
    (g, l_sum, w_sum, m_sum), _ = jax.lax.scan(body, (g0, 0.0, 0.0, m0), (parts, keys))
    return g, l_sum, w_sum, m_sum


def _normalise(params: Any, g: Any, l_sum: jax.Array, w_sum: jax.Array,
               m_sum: dict[str, jax.Array]) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
    """(gradient, loss, metrics) from the weighted sums of `_sums`: each divided by Σ w (module docstring)."""
    scale = 1.0 / jnp.maximum(w_sum, 1e-30)
    grads = jax.tree.map(lambda x, p: (x * scale).astype(p.dtype), g, params)
    metrics = {n: v if _is_max(n) else v * scale for n, v in m_sum.items()}
    metrics["weight"] = w_sum
    return grads, l_sum * scale, metrics


def accumulate(loss_fn: LossFn, params: Any, batch: dict[str, jax.Array], key: jax.Array, micro_batches: int,
               compute_dtype: str = "float32") -> tuple[Any, jax.Array, dict[str, jax.Array]]:
    """(gradient, loss, metrics) of the whole batch through `micro_batches` sequential micro-batches (see module
    docstring). Usable on its own (tests, benchmarks) or inside `make_train_step`."""
    return _normalise(params, *_sums(loss_fn, params, batch, key, micro_batches, compute_dtype))


def shards_explicitly(mesh: Mesh) -> bool:
    """Whether jitted functions over `mesh` run their per-row work one batch shard at a time (`per_shard`): on
    CPU devices of several processes.

    XLA:CPU orders a program's collectives by when each operation *starts*, and a control-flow operation
    (conditional, while) has started once its body is under way. The partitioner, given a sharded batch, puts
    collectives inside the model's control flow (the "block" MoE scheme's `lax.cond` and `fori_loop`s, the
    vocabulary scan of `token_logprobs` over an fsdp-sharded unembedding), so a body's later collective, resumed
    on a worker thread, races the next collective after it. Within one process that is
    harmless (collectives meet by op id); across processes gloo pairs messages in arrival order, and one process
    issuing them in the other order aborts the run ("op.preamble.length <= op.nbytes ... collective mismatch").
    Per shard, the model sees only local rows and replicated parameters: no collective inside it at all (devices
    along a mesh axis the batch is not split over, e.g. tensor, repeat their shard's work).
    """
    devices = list(mesh.devices.flat)
    return devices[0].platform == "cpu" and len({d.process_index for d in devices}) > 1


def _row_axes(mesh: Mesh, rows: int) -> tuple[str, ...]:
    """The mesh axes a batch of `rows` rows is split over (`batch_sharding`)."""
    first = batch_sharding(mesh, (rows,)).spec[0]
    return () if first is None else (first,) if isinstance(first, str) else tuple(first)


def per_shard(fn: Callable[..., Any], mesh: Mesh, rows: int, out_rows: bool) -> Callable[..., Any]:
    """`fn(params, batch, *rest)` run on each batch shard of `mesh` (`shard_map`): params and `rest` replicated
    (gathered at the boundary), `batch` split by rows over the mesh's batch axes (`batch_sharding`); the output
    split by rows again (`out_rows`) or replicated (fn then combines across those axes itself)."""
    rows_spec = PartitionSpec(_row_axes(mesh, rows))
    out = rows_spec if out_rows else PartitionSpec()

    def wrapped(params, batch, *rest):
        specs = (PartitionSpec(), jax.tree.map(lambda _: rows_spec, batch), *(PartitionSpec() for _ in rest))
        # check_vma off: model code starts loop carries from replicated zeros that the shard's rows then vary.
        return jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=out, check_vma=False)(params, batch, *rest)

    return wrapped


def sharded_accumulate(loss_fn: LossFn, params: Any, batch: dict[str, jax.Array], key: jax.Array, micro_batches: int,
                       compute_dtype: str, mesh: Mesh) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
    """`accumulate` with each batch shard of `mesh` as one more level of micro-batching: every shard sums its
    own micro-batches (`_sums`, key folded with the shard index), the shards' sums are added (`psum`; *_max by
    `pmax`), then divided by Σ w. Equal to `accumulate` over the rows in shard order with shards × micro_batches
    micro-batches. Statistics that are not sums over rows (the router's load-balancing loss) are per shard, as they
    are per micro-batch."""
    rows = jax.tree.leaves(batch)[0].shape[0]
    axes = _row_axes(mesh, rows)
    if not axes:  # rows the mesh does not divide: one copy on every device
        return accumulate(loss_fn, params, batch, key, micro_batches, compute_dtype)

    def local(params, batch, key):
        key = jax.random.fold_in(key, jax.lax.axis_index(axes))
        g, l_sum, w_sum, m_sum = _sums(loss_fn, params, batch, key, micro_batches, compute_dtype)
        g, l_sum, w_sum = jax.lax.psum((g, l_sum, w_sum), axes)
        m_sum = {n: jax.lax.pmax(v, axes) if _is_max(n) else jax.lax.psum(v, axes) for n, v in m_sum.items()}
        return g, l_sum, w_sum, m_sum

    return _normalise(params, *per_shard(local, mesh, rows, out_rows=False)(params, batch, key))


def eval_fn(fn: Callable[[Any, dict[str, jax.Array]], Any], mesh: Mesh | None, *, combine: str,
            explicit_shards: bool | None = None) -> Callable[[Any, dict[str, jax.Array]], Any]:
    """`fn(params, batch)` jitted for evaluation, its outputs replicated (every process reads all of them).

    combine="sum": fn returns sums over the batch's rows (any pytree); combine="rows": fn returns per-row arrays
    [B, ...]. On a mesh that `shards_explicitly` (None: decided by the mesh, as in `make_train_step`) fn runs on
    each batch shard (`per_shard`, no collective inside the model) and the shards' sums are added (`psum`), or
    their rows concatenated in row order; otherwise the partitioner splits the whole call.
    """
    if combine not in ("sum", "rows"):
        raise ValueError(f"eval_fn: combine must be 'sum' or 'rows', got {combine!r}")
    rep = None if mesh is None else NamedSharding(mesh, PartitionSpec())
    plain = jax.jit(fn) if rep is None else jax.jit(fn, out_shardings=rep)
    if mesh is None or not (shards_explicitly(mesh) if explicit_shards is None else explicit_shards):
        return plain
    compiled: dict[int, Callable] = {}

    def for_rows(rows: int):
        """The jitted function for batches of `rows` rows (built once per row count)."""
        if rows not in compiled:
            axes = _row_axes(mesh, rows)
            if not axes:  # rows the mesh does not divide: one copy everywhere
                compiled[rows] = plain
            elif combine == "sum":
                local = per_shard(lambda p, b: jax.lax.psum(fn(p, b), axes), mesh, rows, out_rows=False)
                compiled[rows] = jax.jit(local, out_shardings=rep)
            else:
                compiled[rows] = jax.jit(per_shard(fn, mesh, rows, out_rows=True), out_shardings=rep)
        return compiled[rows]

    def call(params, batch):
        return for_rows(jax.tree.leaves(batch)[0].shape[0])(params, batch)

    call.for_rows = for_rows
    return call


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
    explicit_shards: bool | None = None,
) -> Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]:
    """The jitted step; the state argument is donated (its buffers are reused for the new state).

    With `state_shardings` and `mesh` the output state keeps exactly the input layout and metrics come back
    replicated; the batch's sharding is taken from the arrays passed in (see `device_batch`). With a mesh, the
    loss and its gradient run per batch shard (`sharded_accumulate`) when `explicit_shards` says so (None:
    `shards_explicitly(mesh)`, i.e. across CPU processes), else the partitioner splits the whole step.
    """

    shard = mesh is not None and (shards_explicitly(mesh) if explicit_shards is None else explicit_shards)

    def step(state: TrainState, batch: dict[str, jax.Array]):
        if shard:
            grads, loss, metrics = sharded_accumulate(loss_fn, state.params, batch, step_key(state), micro_batches,
                                                      compute_dtype, mesh)
        else:
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
