"""`TrainState` (step, params, opt_state, rng), its abstract form and shardings, and sharded creation.

The state is created already sharded (never a full unsharded copy on one host):

    abstract  = jax.eval_shape(init, params)                       shapes and dtypes only
    shardings = params' shardings (their logical axes) mapped onto the optimizer moments; scalars replicated
    state     = jax.jit(init, out_shardings=shardings)(params)

The PRNG key lives in the state and is split inside the jitted step (`fold_in(rng, step)`), so a restored state
continues the exact random stream of an uninterrupted run.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec


@struct.dataclass
class TrainState:
    """The whole trainable state of a stage; a pytree (orbax saves and restores it as one item)."""

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def opt_state_shardings(tx: optax.GradientTransformation, abstract_params: Any, param_shardings: Any,
                        mesh: Mesh) -> Any:
    """Shardings of tx's state: each per-parameter leaf (Adam moments) takes its parameter's sharding, every other
    leaf (step counters, schedule state) is replicated."""
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    rep = replicated(mesh)
    return optax.tree_utils.tree_map_params(
        tx, lambda _, sharding: sharding, abstract_opt, param_shardings,
        transform_non_params=lambda _: rep, is_leaf=lambda x: isinstance(x, NamedSharding),
    )


def state_shardings(tx: optax.GradientTransformation, abstract_params: Any, param_shardings: Any,
                    mesh: Mesh) -> TrainState:
    """NamedSharding of every leaf of the TrainState built over params of these shardings."""
    rep = replicated(mesh)
    return TrainState(step=rep, params=param_shardings,
                      opt_state=opt_state_shardings(tx, abstract_params, param_shardings, mesh), rng=rep)


def _key_data(key: jax.Array) -> jax.Array:
    return jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key


def create_state(params: Any, tx: optax.GradientTransformation, seed: int, mesh: Mesh,
                 param_shardings: Any) -> TrainState:
    """A fresh TrainState over (already sharded) `params`: step 0, tx.init moments sharded like their params.

    The rng is stored as raw uint32 key data (checkpointable as a plain array) and wrapped back with
    `jax.random.wrap_key_data` where used.
    """
    abstract = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
    shardings = state_shardings(tx, abstract, param_shardings, mesh)

    def init(p):
        # The barrier makes the state's params new buffers: a jit output that is an input would be forwarded as the
        # caller's own arrays, and the donated train step would then delete the caller's `params`.
        p = jax.lax.optimization_barrier(p)
        return TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p),
                          rng=_key_data(jax.random.key(seed)))

    return jax.jit(init, out_shardings=shardings)(params)


def abstract_state(tx: optax.GradientTransformation, abstract_params: Any, param_shardings: Any,
                   mesh: Mesh) -> TrainState:
    """ShapeDtypeStructs (with shardings) of the TrainState: the restore target of a checkpoint."""
    shardings = state_shardings(tx, abstract_params, param_shardings, mesh)

    def init(p):
        return TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p),
                          rng=_key_data(jax.random.key(0)))

    shapes = jax.eval_shape(init, abstract_params)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def step_key(state: TrainState) -> jax.Array:
    """The PRNG key of the step `state.step` (use inside jit): fold_in(rng, step)."""
    return jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
