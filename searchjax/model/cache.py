"""The decode cache (QWEN35.md §4): a pytree with one row per sequence, designed for serving slots.

    lengths [B] int32                     tokens already in each row
    k, v    [Lf,B,S,K,H]  (activation)    full-attention keys (after k_norm and RoPE) and values; slot s = position s
    conv_q, conv_k [Ll,B,Kc,Nk,Dk], conv_v [Ll,B,Kc,Nv,Dv]  (activation)
                                          last Kc pre-conv in_proj_qkv outputs (HF conv_states, split q|k|v)
    state   [Ll,B,Nv,Dk,Dv] fp32          Gated DeltaNet recurrent state S

Per token, only k/v grow; the DeltaNet state is a fixed size per sequence.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh

from searchjax.model.config import ModelConfig
from searchjax.sharding import logical_sharding


@struct.dataclass
class Cache:
    """Decode cache; see the module docstring for shapes. `max_len` = k.shape[2]."""

    lengths: Any
    k: Any
    v: Any
    conv_q: Any
    conv_k: Any
    conv_v: Any
    state: Any

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def conv(self) -> tuple:
        return self.conv_q, self.conv_k, self.conv_v


CACHE_AXES = Cache(
    lengths=("batch",),
    k=("layers", "batch", "cache_seq", "kv_heads", "head_dim"),
    v=("layers", "batch", "cache_seq", "kv_heads", "head_dim"),
    conv_q=("layers", "batch", None, "kv_heads", "head_dim"),
    conv_k=("layers", "batch", None, "kv_heads", "head_dim"),
    conv_v=("layers", "batch", None, "q_heads", "head_dim"),
    state=("layers", "batch", "q_heads", "head_dim", None),
)


def cache_shapes(cfg: ModelConfig, batch: int, max_len: int, dtype="float32") -> Cache:
    """ShapeDtypeStructs of a cache (for AOT compilation and memory accounting)."""
    lf, ll, kc = cfg.num_full_layers, cfg.num_linear_layers, cfg.linear_conv_kernel_dim
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    act, sds = jnp.dtype(dtype), jax.ShapeDtypeStruct
    kv = sds((lf, batch, max_len, cfg.num_key_value_heads, cfg.head_dim), act)
    return Cache(
        lengths=sds((batch,), jnp.int32),
        k=kv,
        v=kv,
        conv_q=sds((ll, batch, kc, nk, dk), act),
        conv_k=sds((ll, batch, kc, nk, dk), act),
        conv_v=sds((ll, batch, kc, nv, dv), act),
        state=sds((ll, batch, nv, dk, dv), jnp.float32),
    )


def cache_shardings(cfg: ModelConfig, batch: int, max_len: int, mesh: Mesh, dtype="float32") -> Cache:
    """NamedShardings of a cache on `mesh`, from CACHE_AXES."""
    shapes = cache_shapes(cfg, batch, max_len, dtype)
    return jax.tree.map(lambda s, axes: logical_sharding(mesh, axes, s.shape), shapes, CACHE_AXES)


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype="float32", mesh: Mesh | None = None) -> Cache:
    """An empty cache (all zeros, lengths 0) for `batch` rows of up to `max_len` tokens."""
    return _zeros_fn(cfg, batch, max_len, jnp.dtype(dtype).name, mesh)()


@functools.lru_cache(maxsize=64)
def _zeros_fn(cfg: ModelConfig, batch: int, max_len: int, dtype: str, mesh: Mesh | None):
    """The jitted zero-cache builder, compiled once per (config, shape, dtype, mesh) (a fresh jit per call
    recompiled every time: ~130 ms per `init_cache` on the small preset)."""
    shapes = cache_shapes(cfg, batch, max_len, dtype)
    out = cache_shardings(cfg, batch, max_len, mesh, dtype) if mesh is not None else None
    return jax.jit(lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes), out_shardings=out)


_FIELDS = ("lengths", "k", "v", "conv_q", "conv_k", "conv_v", "state")


def _batch_axis(field: str) -> int:
    return 0 if field == "lengths" else 1


def take_rows(cache: Cache, rows: jax.Array, empty: jax.Array | None = None) -> Cache:
    """The [P]-row cache of rows `rows` [P] int32 of `cache`; a row index out of range reads as an empty row,
    and so does row p when empty[p] (a fresh sequence: lengths 0, zero conv and DeltaNet states). Jit-able."""
    def take(field):
        axis = _batch_axis(field)
        part = jnp.take(getattr(cache, field), rows, axis=axis, mode="fill", fill_value=0)
        if empty is None:
            return part
        keep = jnp.reshape(~empty, (1,) * axis + (-1,) + (1,) * (part.ndim - axis - 1))
        return jnp.where(keep, part, jnp.zeros((), part.dtype))
    return Cache(**{f: take(f) for f in _FIELDS})


def put_rows(cache: Cache, rows: jax.Array, part: Cache) -> Cache:
    """`cache` with rows `rows` [P] replaced by the P rows of `part`; out-of-range row indices are dropped."""
    def put(field):
        full, axis = getattr(cache, field), _batch_axis(field)
        index = (slice(None),) * axis + (rows,)
        return full.at[index].set(getattr(part, field).astype(full.dtype), mode="drop")
    return Cache(**{f: put(f) for f in _FIELDS})


def _insert(batch_cache: Cache, one_cache: Cache, slot) -> Cache:
    """Row `slot` of every array of batch_cache replaced by row 0 of one_cache (batch axis: 0 for lengths, else 1)."""

    def put(big, small, axis):
        row = jax.lax.dynamic_index_in_dim(small, 0, axis=axis, keepdims=True).astype(big.dtype)
        if row.shape[axis + 1:] != big.shape[axis + 1:] or row.shape[:axis] != big.shape[:axis]:
            raise ValueError(f"insert_cache: row shape {row.shape} does not fit a cache of shape {big.shape}")
        return jax.lax.dynamic_update_index_in_dim(big, row, slot, axis=axis)

    leaves = {f: put(getattr(batch_cache, f), getattr(one_cache, f), _batch_axis(f)) for f in _FIELDS}
    return Cache(**leaves)


def _check_seq(batch_cache: Cache, one_cache: Cache) -> None:
    if one_cache.max_len != batch_cache.max_len:
        raise ValueError(
            f"insert_cache: one_cache holds {one_cache.max_len} positions, batch_cache {batch_cache.max_len}; "
            "they must be equal"
        )


_insert_jit = jax.jit(_insert, donate_argnums=(0,))


def insert_cache(batch_cache: Cache, one_cache: Cache, slot) -> Cache:
    """Put row 0 of `one_cache` into row `slot` of `batch_cache` (a JetStream slot insert). batch_cache is donated."""
    _check_seq(batch_cache, one_cache)
    return _insert_jit(batch_cache, one_cache, jnp.asarray(slot, jnp.int32))


def cache_bytes(cfg: ModelConfig, dtype="bfloat16") -> tuple[int, int]:
    """(bytes per token per sequence — the KV cache, fixed bytes per sequence — conv + fp32 DeltaNet state)."""
    shapes = cache_shapes(cfg, 1, 1, dtype)
    per_token = sum(x.size * x.dtype.itemsize for x in (shapes.k, shapes.v))
    fixed = sum(x.size * x.dtype.itemsize for x in (shapes.conv_q, shapes.conv_k, shapes.conv_v, shapes.state))
    return per_token, fixed
