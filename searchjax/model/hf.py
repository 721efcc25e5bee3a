"""Hugging Face checkpoints <-> Params (QWEN35.md §5.4, §5.5). No torch: safetensors + numpy only.

Load accepts config.json of `qwen3_5_moe` (nested text_config) or `qwen3_5_moe_text`; one model.safetensors or
shards listed in model.safetensors.index.json; routed experts per expert (`mlp.experts.{e}.gate_proj.weight`, …,
as save_pretrained writes) or fused (`mlp.experts.gate_up_proj` [E,2F,D] gate rows first, `down_proj` [E,D,F]);
the text prefix `model.` or `model.language_model.` (then `model.visual.*` and `mtp.*` are simply never read).

Every stacked parameter is built with `jax.make_array_from_callback` into its target sharding: each device's
callback reads only the layers (and, for experts, only the expert rows) of its own shard, tensor by tensor, so
the whole model never sits in one host's memory.

Save writes a `qwen3_5_moe_text` directory (config.json + safetensors, per-expert tensors as save_pretrained does,
sharded with an index when larger than `max_shard_bytes`) that transformers' Qwen3_5MoeForCausalLM loads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from searchjax.model.config import FULL, LINEAR, ModelConfig, from_hf_config, to_hf_config
from searchjax.model.params import ParamSpec, Params, param_shardings, param_specs

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint is missing a tensor, has a wrong shape, or cannot be read; the message names it."""


# --------------------------------------------------------------------------------------------------------------
# Per-layer tensor maps, HF -> ours: field -> (HF suffixes, expected HF shapes, to_ours(list of arrays) -> array).


def _t(a):  # [out, in] -> [in, out]
    return np.ascontiguousarray(a.T)


def _dense(name, d, *head_shape):
    """HF linear [prod(head_shape), D] -> ours [D, *head_shape]."""
    n = int(np.prod(head_shape))
    return (name,), ((n, d),), lambda a: _t(a[0]).reshape(d, *head_shape)


def _out(name, d, *head_shape):
    """HF output projection [D, prod(head_shape)] -> ours [*head_shape, D]."""
    n = int(np.prod(head_shape))
    return (name,), ((d, n),), lambda a: _t(a[0]).reshape(*head_shape, d)


def _same(name, shape):
    return (name,), (shape,), lambda a: a[0]


def _rows(name, shape, lo, hi, d, *head_shape):
    """Rows lo:hi of HF linear `name` [rows, D] -> ours [D, *head_shape] (in_proj_qkv is flat [q | k | v])."""
    return (name,), (shape,), lambda a: _t(a[0][lo:hi]).reshape(d, *head_shape)


def _moe_maps(cfg: ModelConfig) -> dict:
    d, e, fs = cfg.hidden_size, cfg.num_experts, cfg.shared_expert_intermediate_size
    return {
        "router": (("mlp.gate.weight",), ((e, d),), lambda a: _t(a[0])),
        "shared_gate": _dense("mlp.shared_expert.gate_proj.weight", d, fs),
        "shared_up": _dense("mlp.shared_expert.up_proj.weight", d, fs),
        "shared_down": _out("mlp.shared_expert.down_proj.weight", d, fs),
        "shared_expert_gate": (("mlp.shared_expert_gate.weight",), ((1, d),), lambda a: a[0][0]),
    }


def _attention_maps(cfg: ModelConfig) -> dict:
    d, n, k, h = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    def q_part(j):  # q_proj rows are per head [q_h | gate_h]: [N*2*H, D] -> [N, 2, H, D] -> part j as [D, N, H]
        return lambda a: np.ascontiguousarray(np.transpose(a[0].reshape(n, 2, h, d)[:, j], (2, 0, 1)))

    return {
        "input_norm": _same("input_layernorm.weight", (d,)),
        "post_norm": _same("post_attention_layernorm.weight", (d,)),
        "wq": (("self_attn.q_proj.weight",), ((n * 2 * h, d),), q_part(0)),
        "wgate": (("self_attn.q_proj.weight",), ((n * 2 * h, d),), q_part(1)),
        "wk": _dense("self_attn.k_proj.weight", d, k, h),
        "wv": _dense("self_attn.v_proj.weight", d, k, h),
        "wo": _out("self_attn.o_proj.weight", d, n, h),
        "q_norm": _same("self_attn.q_norm.weight", (h,)),
        "k_norm": _same("self_attn.k_norm.weight", (h,)),
    }


def _deltanet_maps(cfg: ModelConfig) -> dict:
    d, kc, c = cfg.hidden_size, cfg.linear_conv_kernel_dim, cfg.conv_dim
    nk, nv, dk, dv = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                      cfg.linear_value_head_dim)
    kd = nk * dk
    spans = {"q": (0, kd, (nk, dk)), "k": (kd, 2 * kd, (nk, dk)), "v": (2 * kd, c, (nv, dv))}

    def conv(lo, hi, shape):  # conv1d.weight [C, 1, Kc] -> rows lo:hi as ours [Kc, *shape]
        return (("linear_attn.conv1d.weight",), ((c, 1, kc),), lambda a: _t(a[0][lo:hi, 0, :]).reshape(kc, *shape))

    maps = {
        "input_norm": _same("input_layernorm.weight", (d,)),
        "post_norm": _same("post_attention_layernorm.weight", (d,)),
        "wz": _dense("linear_attn.in_proj_z.weight", d, nv, dv),
        "wb": _dense("linear_attn.in_proj_b.weight", d, nv),
        "wa": _dense("linear_attn.in_proj_a.weight", d, nv),
        "a_log": _same("linear_attn.A_log", (nv,)),
        "dt_bias": _same("linear_attn.dt_bias", (nv,)),
        "norm": _same("linear_attn.norm.weight", (dv,)),
        "wo": _out("linear_attn.out_proj.weight", d, nv, dv),
    }
    for x, (lo, hi, shape) in spans.items():
        maps["w" + x] = _rows("linear_attn.in_proj_qkv.weight", (c, d), lo, hi, d, *shape)
        maps["conv_" + x] = conv(lo, hi, shape)
    return maps


# --------------------------------------------------------------------------------------------------------------
# Reading


def read_json(path: Path, what: str) -> dict:
    """The JSON object in `path`; CheckpointError naming the file (and line:column) when it cannot be read."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                              f"the {what} is corrupt or truncated") from None
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not UTF-8 text (byte {e.start}); the {what} is corrupt") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _safetensors_error(file: Path, e: Exception) -> CheckpointError:
    return CheckpointError(f"{file}: not a readable safetensors file ({e}); it may be truncated or corrupt")


def _tensor_names(file: Path) -> list[str]:
    """The tensor names in one safetensors file's header (this also checks the header against the file size)."""
    try:
        with safe_open(file, framework="numpy") as f:
            return list(f.keys())
    except (SafetensorError, OSError) as e:
        raise _safetensors_error(file, e) from None


class _Reader:
    """Tensor-by-tensor access to a safetensors checkpoint (single file or index), text prefix resolved.

    Every file's header is read up front, so a truncated or corrupt file is reported (by name) before any
    tensor is loaded.
    """

    def __init__(self, path: Path):
        index = path / SAFETENSORS_INDEX
        if index.exists():
            weight_map = read_json(index, "checkpoint index").get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
                raise CheckpointError(f"{index}: expected a 'weight_map' object of tensor name -> file name")
            self.files = {name: path / f for name, f in weight_map.items()}
            for file in sorted(set(self.files.values())):
                if not file.is_file():
                    raise CheckpointError(f"{index}: lists {file.name}, which is missing")
                _tensor_names(file)
        elif (path / SAFETENSORS_SINGLE).exists():
            self.files = {name: path / SAFETENSORS_SINGLE for name in _tensor_names(path / SAFETENSORS_SINGLE)}
        else:
            raise CheckpointError(f"{path}: no {SAFETENSORS_SINGLE} or {SAFETENSORS_INDEX}")
        self.path = path
        mm = "model.language_model.embed_tokens.weight" in self.files
        self.prefix = "model.language_model." if mm else "model."

    def has(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str, shape: tuple[int, ...], rows: slice | None = None) -> np.ndarray:
        """Tensor `name` (checked against `shape`); with `rows`, only that slice of its first axis is read."""
        if name not in self.files:
            raise CheckpointError(f"{self.path}: missing tensor {name!r}")
        try:
            with safe_open(self.files[name], framework="numpy") as f:
                sl = f.get_slice(name)
                got = tuple(sl.get_shape())
                if got != tuple(shape):
                    raise CheckpointError(f"{self.path}: tensor {name!r} has shape {list(got)}, expected {list(shape)}")
                return sl[rows] if rows is not None else sl[:]
        except (SafetensorError, OSError) as e:
            raise _safetensors_error(self.files[name], e) from None


def _experts_ours(reader: _Reader, layer: str, field: str, cfg: ModelConfig, experts: slice) -> np.ndarray:
    """w_gate/w_up [e,D,F] or w_down [e,F,D] for the experts in `experts`, from fused or per-expert tensors."""
    d, e, f = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    fused = layer + "mlp.experts.gate_up_proj"
    if reader.has(fused):
        if field == "w_down":
            a = reader.get(layer + "mlp.experts.down_proj", (e, d, f), experts)
            return np.ascontiguousarray(np.transpose(a, (0, 2, 1)))
        a = reader.get(fused, (e, 2 * f, d), experts)
        a = a[:, :f] if field == "w_gate" else a[:, f:]
        return np.ascontiguousarray(np.transpose(a, (0, 2, 1)))
    hf, shape = {"w_gate": ("gate_proj", (f, d)), "w_up": ("up_proj", (f, d)), "w_down": ("down_proj", (d, f))}[field]
    ids = range(*experts.indices(e))
    return np.stack([_t(reader.get(f"{layer}mlp.experts.{i}.{hf}.weight", shape)) for i in ids])


def _layer_indices(cfg: ModelConfig, kind: str) -> list[int]:
    return [i for i, t in enumerate(cfg.layer_types) if t == kind]


def _read_layer_field(reader, cfg, kind, field, layer_idx, rest: tuple) -> np.ndarray:
    """One layer's value of our field (moe.* included), restricted to the index `rest` of the non-layer dims."""
    layer = f"{reader.prefix}layers.{layer_idx}."
    if field.startswith("moe."):
        sub = field[4:]
        if sub in ("w_gate", "w_up", "w_down"):
            a = _experts_ours(reader, layer, sub, cfg, rest[0] if rest else slice(None))
            return a[(slice(None),) + tuple(rest[1:])]
        names, shapes, to_ours = _moe_maps(cfg)[sub]
    else:
        names, shapes, to_ours = (_deltanet_maps if kind == LINEAR else _attention_maps)(cfg)[field]
    a = to_ours([reader.get(layer + n, s) for n, s in zip(names, shapes)])
    return a[tuple(rest)]


def _field_paths(tree, prefix=""):
    """(dotted path, ParamSpec) for every leaf of a per-type layer spec."""
    out = []
    for name, value in vars(tree).items():
        if isinstance(value, ParamSpec):
            out.append((prefix + name, value))
        else:
            out.extend(_field_paths(value, prefix + name + "."))
    return out


def _make_array(spec: ParamSpec, sharding, dtype, read_block):
    """jax.Array of `spec` in `sharding`; read_block(index) returns the numpy block of a device's shard."""
    dt = jnp.dtype(spec.dtype or dtype)
    return jax.make_array_from_callback(spec.shape, sharding, lambda idx: np.asarray(read_block(idx)).astype(dt))


def _load_stacked(reader, cfg, kind, specs, shardings, dtype):
    """Stacked per-type layer params: each shard reads only its own layers (and experts)."""
    layers = _layer_indices(cfg, kind)
    out = {}
    for path, spec in _field_paths(specs):
        sharding = _get(shardings, path)

        def block(idx, path=path, shape=spec.shape):
            ids = range(*idx[0].indices(len(layers)))
            if not ids:  # a type with no layer (e.g. full_attention_interval 1: no DeltaNet): an empty stack
                return np.zeros([len(range(*i.indices(n))) for i, n in zip(idx, shape)], np.float32)
            return np.stack([_read_layer_field(reader, cfg, kind, path, layers[i], idx[1:]) for i in ids])

        out[path] = _make_array(spec, sharding, dtype, block)
    return _set_all(specs, out)


def _get(tree, path: str):
    for part in path.split("."):
        tree = getattr(tree, part)
    return tree


def _set_all(tree, values: dict, prefix=""):
    changes = {}
    for name, value in vars(tree).items():
        key = prefix + name
        changes[name] = values[key] if isinstance(value, ParamSpec) else _set_all(value, values, key + ".")
    return tree.replace(**changes)


def read_hf_config(path: str | os.PathLike) -> ModelConfig:
    """ModelConfig of a checkpoint directory's config.json."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.exists():
        raise CheckpointError(f"{path}: no config.json")
    hf = read_json(cfg_path, "config")
    try:
        return from_hf_config(hf)
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # ConfigError, or a value of the wrong shape
        reason = f"missing field {e.args[0]!r}" if isinstance(e, KeyError) else str(e)
        raise CheckpointError(f"{cfg_path}: {reason}") from None


def checkpoint_files(path: str | os.PathLike) -> dict[str, int]:
    """{file name: tensor count} of a checkpoint's safetensors files, every header checked; CheckpointError
    naming a missing, truncated or corrupt file."""
    reader = _Reader(Path(path))
    counts: dict[str, int] = {}
    for file in reader.files.values():
        counts[file.name] = counts.get(file.name, 0) + 1
    return dict(sorted(counts.items()))


def load_hf(path: str | os.PathLike, dtype="float32", mesh: Mesh | None = None) -> tuple[ModelConfig, Params]:
    """(cfg, params) from an HF checkpoint directory, parameters created straight in their shardings."""
    path = Path(path)
    cfg = read_hf_config(path)
    reader = _Reader(path)
    specs = param_specs(cfg)
    if mesh is not None:
        shardings = param_shardings(cfg, mesh)
    else:
        one = SingleDeviceSharding(jax.devices()[0])
        shardings = jax.tree.map(lambda s: one, specs, is_leaf=lambda x: isinstance(x, ParamSpec))
    d, v = cfg.hidden_size, cfg.vocab_size

    def glob(name, spec, sharding, shape):
        return _make_array(spec, sharding, dtype, lambda idx: reader.get(name, shape)[idx])

    lm_head = None
    if specs.lm_head is not None:
        lm_head = glob("lm_head.weight", specs.lm_head, shardings.lm_head, (v, d))
    return cfg, Params(
        embed=glob(reader.prefix + "embed_tokens.weight", specs.embed, shardings.embed, (v, d)),
        lm_head=lm_head,
        final_norm=glob(reader.prefix + "norm.weight", specs.final_norm, shardings.final_norm, (d,)),
        linear=_load_stacked(reader, cfg, LINEAR, specs.linear, shardings.linear, dtype),
        full=_load_stacked(reader, cfg, FULL, specs.full, shardings.full, dtype),
    )


# --------------------------------------------------------------------------------------------------------------
# Saving


def _flat(w, lead: int):
    """ours [*lead dims, *rest] -> [prod(lead dims), prod(rest)]."""
    return w.reshape(int(np.prod(w.shape[:lead])), -1)


def _moe_to_hf(m: dict, cfg: ModelConfig) -> dict:
    out = {
        "mlp.gate.weight": _t(m["router"]),
        "mlp.shared_expert.gate_proj.weight": _t(m["shared_gate"]),
        "mlp.shared_expert.up_proj.weight": _t(m["shared_up"]),
        "mlp.shared_expert.down_proj.weight": _t(m["shared_down"]),
        "mlp.shared_expert_gate.weight": m["shared_expert_gate"][None],
    }
    for e in range(cfg.num_experts):
        out[f"mlp.experts.{e}.gate_proj.weight"] = _t(m["w_gate"][e])
        out[f"mlp.experts.{e}.up_proj.weight"] = _t(m["w_up"][e])
        out[f"mlp.experts.{e}.down_proj.weight"] = _t(m["w_down"][e])
    return out


def _attention_to_hf(p: dict, cfg: ModelConfig) -> dict:
    n, h, d = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
    q = np.stack([np.transpose(p["wq"], (1, 2, 0)), np.transpose(p["wgate"], (1, 2, 0))], axis=1)
    return {
        "input_layernorm.weight": p["input_norm"],
        "post_attention_layernorm.weight": p["post_norm"],
        "self_attn.q_proj.weight": q.reshape(n * 2 * h, d),
        "self_attn.k_proj.weight": _t(_flat(p["wk"], 1)),
        "self_attn.v_proj.weight": _t(_flat(p["wv"], 1)),
        "self_attn.o_proj.weight": _t(_flat(p["wo"], 2)),
        "self_attn.q_norm.weight": p["q_norm"],
        "self_attn.k_norm.weight": p["k_norm"],
    }


def _deltanet_to_hf(p: dict, cfg: ModelConfig) -> dict:
    kc = cfg.linear_conv_kernel_dim
    qkv = np.concatenate([_flat(p[k], 1) for k in ("wq", "wk", "wv")], axis=1)
    conv = np.concatenate([p[k].reshape(kc, -1) for k in ("conv_q", "conv_k", "conv_v")], axis=1)
    return {
        "input_layernorm.weight": p["input_norm"],
        "post_attention_layernorm.weight": p["post_norm"],
        "linear_attn.in_proj_qkv.weight": _t(qkv),
        "linear_attn.in_proj_z.weight": _t(_flat(p["wz"], 1)),
        "linear_attn.in_proj_b.weight": _t(p["wb"]),
        "linear_attn.in_proj_a.weight": _t(p["wa"]),
        "linear_attn.conv1d.weight": _t(conv)[:, None, :],
        "linear_attn.A_log": p["a_log"],
        "linear_attn.dt_bias": p["dt_bias"],
        "linear_attn.norm.weight": p["norm"],
        "linear_attn.out_proj.weight": _t(_flat(p["wo"], 2)),
    }


def _layer_values(stacked, i: int) -> dict:
    """Layer i of a stacked per-type pytree as {field: numpy array} (moe fields nested under "moe")."""
    out = {}
    for name, value in vars(stacked).items():
        out[name] = _layer_values(value, i) if not hasattr(value, "shape") else np.asarray(value[i])
    return out


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def _save_file(tensors: dict[str, np.ndarray], file: Path) -> None:
    """safetensors' save_file with the file mode the user's umask gives (its writer creates files 0600)."""
    save_file(tensors, str(file), metadata={"format": "pt"})
    os.chmod(file, 0o666 & ~_umask())


class _ShardWriter:
    """Writes tensors into safetensors files of at most ~max_bytes each, then an index if there is more than one."""

    def __init__(self, path: Path, max_bytes: int):
        self.path, self.max_bytes = path, max_bytes
        self.pending: dict[str, np.ndarray] = {}
        self.files: list[dict[str, np.ndarray]] = []
        self.weight_map: dict[str, str] = {}
        self.size = 0

    def add(self, name: str, array: np.ndarray) -> None:
        if self.pending and self.size + array.nbytes > self.max_bytes:
            self._flush()
        self.pending[name] = np.ascontiguousarray(array)
        self.size += array.nbytes

    def _flush(self) -> None:
        fname = f"model-{len(self.files) + 1:05d}.safetensors"
        _save_file(self.pending, self.path / fname)
        self.weight_map.update({k: fname for k in self.pending})
        self.files.append({})
        self.pending, self.size = {}, 0

    def close(self) -> None:
        if not self.files:  # everything fits in one file: the plain single-file layout
            _save_file(self.pending, self.path / SAFETENSORS_SINGLE)
            return
        if self.pending:
            self._flush()
        total = sum((self.path / f).stat().st_size for f in set(self.weight_map.values()))
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(self.weight_map.items()))}
        (self.path / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2))


def save_hf(path: str | os.PathLike, params: Params, cfg: ModelConfig, max_shard_bytes: int = 4 << 30) -> None:
    """Write `params` as a `qwen3_5_moe_text` checkpoint (config.json + safetensors, per-expert tensors).

    Tensors are fetched layer by layer, so host memory holds about one layer (plus one pending shard).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(to_hf_config(cfg), indent=2))
    w = _ShardWriter(path, max_shard_bytes)
    w.add("model.embed_tokens.weight", np.asarray(params.embed))
    if params.lm_head is not None:
        w.add("lm_head.weight", np.asarray(params.lm_head))
    w.add("model.norm.weight", np.asarray(params.final_norm))
    counters = {LINEAR: 0, FULL: 0}
    for i, kind in enumerate(cfg.layer_types):
        j = counters[kind]
        counters[kind] += 1
        vals = _layer_values(params.linear if kind == LINEAR else params.full, j)
        tensors = (_deltanet_to_hf if kind == LINEAR else _attention_to_hf)(vals, cfg)
        tensors.update(_moe_to_hf(vals["moe"], cfg))
        for name, array in tensors.items():
            w.add(f"model.layers.{i}.{name}", array)
    w.close()
