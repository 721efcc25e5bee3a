"""Parameters of the Qwen3.5 MoE text model, each described ONCE by a `ParamSpec`.

`param_specs(cfg)` returns the `Params` pytree with a `ParamSpec` (shape, logical axes, initialiser, dtype) at every
leaf. Everything else is derived from it: `abstract_params` (ShapeDtypeStructs, for eval_shape/AOT),
`param_shardings` (NamedShardings from searchjax.sharding's logical table) and `init_params` (random weights, created
already sharded by jitting the initialiser with those shardings as out_shardings).

Layout (all matrices are stored input-dim first, so a projection is `einsum("BTD,D...->BT...")`):
layers of one type are stacked on a leading `layers` axis (`Params.linear` for Gated DeltaNet layers,
`Params.full` for gated-attention layers, in the order they appear in `cfg.layer_types`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh

from searchjax.model.config import ModelConfig
from searchjax.sharding import logical_sharding

INITS = ("normal", "zeros", "ones", "a_log")
RANDOM_INITS = ("normal", "a_log")


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One parameter: shape, logical axis names (searchjax.sharding.LOGICAL_AXES), initialiser, dtype override.

    init: "normal" (N(0, 0.02²), HF initializer_range), "zeros" (zero-centred norm offsets), "ones" (plain norm
    weight, dt_bias), "a_log" (log U(0, 16), as HF initialises A_log). `dtype=None` follows the model dtype;
    A_log is kept in float32 (the decay is computed in fp32; QWEN35.md §3.7).
    """

    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    init: str = "normal"
    dtype: str | None = None

    def __post_init__(self):
        if len(self.shape) != len(self.axes):
            raise ValueError(f"ParamSpec: shape {self.shape} and axes {self.axes} differ in rank")
        if self.init not in INITS:
            raise ValueError(f"ParamSpec: unknown init {self.init!r}; valid: {list(INITS)}")

    def stacked(self, n: int) -> "ParamSpec":
        return ParamSpec((n, *self.shape), ("layers", *self.axes), self.init, self.dtype)


@struct.dataclass
class MoEParams:
    """Sparse MoE block (QWEN35.md §3.5): router [D,E]; experts w_gate/w_up [E,D,F], w_down [E,F,D];
    shared expert [D,Fs]/[Fs,D] and its scalar sigmoid gate [D]."""

    router: Any
    w_gate: Any
    w_up: Any
    w_down: Any
    shared_gate: Any
    shared_up: Any
    shared_down: Any
    shared_expert_gate: Any


@struct.dataclass
class AttentionLayer:
    """Gated full-attention layer (§3.3): wq/wgate [D,N,H] (HF q_proj rows split per head into [q|gate]),
    wk/wv [D,K,H], wo [N,H,D], zero-centred q_norm/k_norm [H], input/post norms [D], MoE."""

    input_norm: Any
    wq: Any
    wgate: Any
    wk: Any
    wv: Any
    wo: Any
    q_norm: Any
    k_norm: Any
    post_norm: Any
    moe: MoEParams


@struct.dataclass
class DeltaNetLayer:
    """Gated DeltaNet layer (§3.4): wq/wk [D,Nk,Dk], wv/wz [D,Nv,Dv] (HF in_proj_qkv split, in_proj_z),
    wb/wa [D,Nv], depthwise conv weights conv_q/conv_k [Kc,Nk,Dk], conv_v [Kc,Nv,Dv] (HF conv1d, no bias),
    a_log/dt_bias [Nv], plain gated-norm weight norm [Dv], wo [Nv,Dv,D], input/post norms [D], MoE."""

    input_norm: Any
    wq: Any
    wk: Any
    wv: Any
    wz: Any
    wb: Any
    wa: Any
    conv_q: Any
    conv_k: Any
    conv_v: Any
    a_log: Any
    dt_bias: Any
    norm: Any
    wo: Any
    post_norm: Any
    moe: MoEParams


@struct.dataclass
class Params:
    """The whole text model. `unembed` is the [V,D] output matrix (lm_head, or embed when tied)."""

    embed: Any
    lm_head: Any
    final_norm: Any
    linear: DeltaNetLayer
    full: AttentionLayer

    @property
    def unembed(self):
        """The unembedding matrix [V, D]: logits = h @ unembed.T (HF lm_head.weight)."""
        return self.embed if self.lm_head is None else self.lm_head


def _moe_specs(cfg: ModelConfig) -> MoEParams:
    d, e, f, fs = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    return MoEParams(
        router=ParamSpec((d, e), ("embed", None)),
        w_gate=ParamSpec((e, d, f), ("experts", "embed", "ffw")),
        w_up=ParamSpec((e, d, f), ("experts", "embed", "ffw")),
        w_down=ParamSpec((e, f, d), ("experts", "ffw", "embed")),
        shared_gate=ParamSpec((d, fs), ("embed", "ffw")),
        shared_up=ParamSpec((d, fs), ("embed", "ffw")),
        shared_down=ParamSpec((fs, d), ("ffw", "embed")),
        shared_expert_gate=ParamSpec((d,), ("embed",)),
    )


def _attention_specs(cfg: ModelConfig) -> AttentionLayer:
    d, n, k, h = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    return AttentionLayer(
        input_norm=ParamSpec((d,), ("embed",), "zeros"),
        wq=ParamSpec((d, n, h), ("embed", "q_heads", "head_dim")),
        wgate=ParamSpec((d, n, h), ("embed", "q_heads", "head_dim")),
        wk=ParamSpec((d, k, h), ("embed", "kv_heads", "head_dim")),
        wv=ParamSpec((d, k, h), ("embed", "kv_heads", "head_dim")),
        wo=ParamSpec((n, h, d), ("q_heads", "head_dim", "embed")),
        q_norm=ParamSpec((h,), ("head_dim",), "zeros"),
        k_norm=ParamSpec((h,), ("head_dim",), "zeros"),
        post_norm=ParamSpec((d,), ("embed",), "zeros"),
        moe=_moe_specs(cfg),
    )


def _deltanet_specs(cfg: ModelConfig) -> DeltaNetLayer:
    d, kc = cfg.hidden_size, cfg.linear_conv_kernel_dim
    nk, nv, dk, dv = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                      cfg.linear_value_head_dim)
    return DeltaNetLayer(
        input_norm=ParamSpec((d,), ("embed",), "zeros"),
        wq=ParamSpec((d, nk, dk), ("embed", "kv_heads", "head_dim")),
        wk=ParamSpec((d, nk, dk), ("embed", "kv_heads", "head_dim")),
        wv=ParamSpec((d, nv, dv), ("embed", "q_heads", "head_dim")),
        wz=ParamSpec((d, nv, dv), ("embed", "q_heads", "head_dim")),
        wb=ParamSpec((d, nv), ("embed", "q_heads")),
        wa=ParamSpec((d, nv), ("embed", "q_heads")),
        conv_q=ParamSpec((kc, nk, dk), (None, "kv_heads", "head_dim")),
        conv_k=ParamSpec((kc, nk, dk), (None, "kv_heads", "head_dim")),
        conv_v=ParamSpec((kc, nv, dv), (None, "q_heads", "head_dim")),
        a_log=ParamSpec((nv,), ("q_heads",), "a_log", "float32"),
        dt_bias=ParamSpec((nv,), ("q_heads",), "ones"),
        norm=ParamSpec((dv,), ("head_dim",), "ones"),
        wo=ParamSpec((nv, dv, d), ("q_heads", "head_dim", "embed")),
        post_norm=ParamSpec((d,), ("embed",), "zeros"),
        moe=_moe_specs(cfg),
    )


def _is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


def param_specs(cfg: ModelConfig) -> Params:
    """The Params pytree with a ParamSpec at every leaf (lm_head is None when embeddings are tied)."""
    v, d = cfg.vocab_size, cfg.hidden_size
    stack = lambda tree, n: jax.tree.map(lambda s: s.stacked(n), tree, is_leaf=_is_spec)  # noqa: E731
    return Params(
        embed=ParamSpec((v, d), ("vocab", "embed")),
        lm_head=None if cfg.tie_word_embeddings else ParamSpec((v, d), ("vocab", "embed")),
        final_norm=ParamSpec((d,), ("embed",), "zeros"),
        linear=stack(_deltanet_specs(cfg), cfg.num_linear_layers),
        full=stack(_attention_specs(cfg), cfg.num_full_layers),
    )


def _dtype(spec: ParamSpec, dtype) -> jnp.dtype:
    return jnp.dtype(spec.dtype or dtype)


def abstract_params(cfg: ModelConfig, dtype="float32", mesh: Mesh | None = None) -> Params:
    """ShapeDtypeStructs of every parameter (with shardings when `mesh` is given)."""
    shardings = param_shardings(cfg, mesh) if mesh is not None else None

    def one(spec, sharding=None):
        return jax.ShapeDtypeStruct(spec.shape, _dtype(spec, dtype), sharding=sharding)

    specs = param_specs(cfg)
    if shardings is None:
        return jax.tree.map(one, specs, is_leaf=_is_spec)
    return jax.tree.map(one, specs, shardings, is_leaf=_is_spec)


def param_shardings(cfg: ModelConfig, mesh: Mesh) -> Params:
    """NamedSharding of every parameter on `mesh`, from its logical axes."""
    return jax.tree.map(lambda s: logical_sharding(mesh, s.axes, s.shape), param_specs(cfg), is_leaf=_is_spec)


def _init_one(spec: ParamSpec, z: jax.Array | None, dtype) -> jax.Array:
    """Value of one parameter from its slice `z` of a shared standard-normal draw (None for constant inits)."""
    dt = _dtype(spec, dtype)
    if spec.init == "zeros":
        return jnp.zeros(spec.shape, dt)
    if spec.init == "ones":
        return jnp.ones(spec.shape, dt)
    z = z.reshape(spec.shape)
    if spec.init == "a_log":  # A ~ U(1e-3, 16) via the normal CDF, A_log = log A
        u = 0.5 * (1.0 + jax.lax.erf(z / jnp.sqrt(2.0)))
        return jnp.log(1e-3 + u * (16.0 - 1e-3)).astype(dt)
    return (0.02 * z).astype(dt)


def init_params(cfg: ModelConfig, key: jax.Array, dtype="float32", mesh: Mesh | None = None) -> Params:
    """Random parameters (HF-style init), created already sharded when `mesh` is given.

    All random leaves are cut from ONE standard-normal draw of their total size (one RNG kernel to compile
    instead of one per leaf, which on CPU costs seconds each), so values do not depend on the mesh. The draw is
    materialised whole, so this is meant for test/benchmark sizes; full-size models come from `load_hf`.
    """
    specs = param_specs(cfg)
    leaves, treedef = jax.tree.flatten(specs, is_leaf=_is_spec)
    sizes = [math.prod(s.shape) if s.init in RANDOM_INITS else 0 for s in leaves]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]

    def init(k):
        z = jax.random.normal(k, (max(1, sum(sizes)),), jnp.float32)
        vals = [_init_one(s, z[o:o + n] if s.init in RANDOM_INITS else None, dtype)  # n = 0: an empty stack
                for s, o, n in zip(leaves, offsets, sizes)]
        return jax.tree.unflatten(treedef, vals)

    out_shardings = param_shardings(cfg, mesh) if mesh is not None else None
    return jax.jit(init, out_shardings=out_shardings)(key)


def _count(tree) -> int:
    return sum(math.prod(x.shape) for x in jax.tree.leaves(tree, is_leaf=_is_spec))


def param_count(cfg_or_params: ModelConfig | Params, active: bool = False) -> int:
    """Number of parameters of a config (or of a params pytree).

    active=True counts what one token uses: every non-expert parameter, plus num_experts_per_tok of the
    num_experts routed experts (the input embedding table is included, as one row is read).
    """
    if isinstance(cfg_or_params, ModelConfig):
        cfg, tree = cfg_or_params, param_specs(cfg_or_params)
    else:
        if active:
            raise ValueError("param_count(active=True) needs the ModelConfig, not params")
        return _count(cfg_or_params)
    total = _count(tree)
    if not active:
        return total
    experts = sum(_count([m.w_gate, m.w_up, m.w_down]) for m in (tree.linear.moe, tree.full.moe))
    return total - experts + experts * cfg.num_experts_per_tok // cfg.num_experts
