"""`ModelConfig`: the text part of a Qwen3.5 MoE checkpoint, its presets and the HF config.json mapping.

Field names mirror transformers' `Qwen3_5MoeTextConfig` (QWEN35.md §2.1) so `from_hf_config`/`to_hf_config` are
near-identity maps. Presets live as YAML under configs/model/ and load with `load_preset(name)`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from searchjax.config import ConfigError, configs_dir, from_dict, load_yaml

LINEAR = "linear_attention"
FULL = "full_attention"
LAYER_TYPES = (LINEAR, FULL)
HF_MODEL_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
LAYER_LOOPS = ("auto", "scan", "unroll")
COMPUTE_FIELDS = ("chunk_size", "moe_impl", "layer_loop")  # how to compute, not what: never in config.json


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the Qwen3.5 MoE text decoder (names as in the HF text config).

    `layer_types` may be left empty: it is then built from `full_attention_interval` exactly as HF does
    (layer i is full attention iff (i+1) % interval == 0). `chunk_size` is the Gated DeltaNet chunk length of the
    chunked (prefill/training) algorithm; it is not an HF field and does not change results (16 is the fastest on
    CPU, BENCHMARKS.md; HF's kernels use 64). `moe_impl` picks the routed-expert grouped matmul
    (`searchjax.model.moe_dispatch`): "auto" follows `jax.default_backend()` ("block" on CPU, "ragged" elsewhere);
    set it explicitly when compiling for another platform than the host's (tools/aot_tpu.py compiles for TPU on a
    CPU machine). Not an HF field either; results are the same.
    `layer_loop` runs the decoder layers as one `lax.scan` ("scan": compile time independent of depth) or as a
    Python loop ("unroll": faster on CPU, see `transformer._run_layers`); "auto" unrolls up to 16 layers.
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    layer_types: tuple[str, ...] = ()
    full_attention_interval: int = 4
    max_position_embeddings: int = 262_144
    tie_word_embeddings: bool = False
    router_aux_loss_coef: float = 0.001
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    chunk_size: int = 16
    moe_impl: str = "auto"
    layer_loop: str = "auto"

    def __post_init__(self):
        if not self.layer_types:
            if self.full_attention_interval <= 0:
                raise ConfigError(
                    f"ModelConfig.full_attention_interval must be > 0, got {self.full_attention_interval}"
                )
            types = tuple(
                LINEAR if (i + 1) % self.full_attention_interval else FULL for i in range(self.num_hidden_layers)
            )
            object.__setattr__(self, "layer_types", types)
        self._validate()

    def _validate(self) -> None:
        positive = (
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok",
            "moe_intermediate_size", "shared_expert_intermediate_size", "chunk_size",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"ModelConfig.{name} must be > 0, got {getattr(self, name)}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"ModelConfig.layer_types has {len(self.layer_types)} entries, expected num_hidden_layers="
                f"{self.num_hidden_layers}"
            )
        bad = sorted({t for t in self.layer_types if t not in LAYER_TYPES})
        if bad:
            raise ConfigError(f"ModelConfig.layer_types: unknown types {bad}; valid: {list(LAYER_TYPES)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"ModelConfig: num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(
                f"ModelConfig: linear_num_value_heads={self.linear_num_value_heads} is not a multiple of "
                f"linear_num_key_heads={self.linear_num_key_heads}"
            )
        if self.num_experts_per_tok > self.num_experts:
            raise ConfigError(
                f"ModelConfig: num_experts_per_tok={self.num_experts_per_tok} > num_experts={self.num_experts}"
            )
        if self.chunk_size & (self.chunk_size - 1):
            raise ConfigError(f"ModelConfig.chunk_size must be a power of two, got {self.chunk_size}")
        if self.moe_impl not in ("auto", "block", "ragged"):
            raise ConfigError(f"ModelConfig.moe_impl must be 'auto', 'block' or 'ragged', got {self.moe_impl!r}")
        if self.layer_loop not in LAYER_LOOPS:
            raise ConfigError(f"ModelConfig.layer_loop must be one of {LAYER_LOOPS}, got {self.layer_loop!r}")
        rot = self.rotary_dim
        if not 0.0 < self.partial_rotary_factor <= 1.0 or rot % 2 or rot == 0:
            raise ConfigError(
                f"ModelConfig.partial_rotary_factor={self.partial_rotary_factor} gives rotary dim {rot} of head_dim "
                f"{self.head_dim}; it must be a positive even number"
            )

    # Derived sizes (QWEN35.md §2.2).
    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def num_linear_layers(self) -> int:
        return sum(t == LINEAR for t in self.layer_types)

    @property
    def num_full_layers(self) -> int:
        return sum(t == FULL for t in self.layer_types)

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with `changes` (re-validated; pass layer_types=() to rebuild it from the interval)."""
        return dataclasses.replace(self, **changes)


def _unsupported(key: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"HF config: unsupported value {key}={value!r}: {why}")


def _hf_text_config(hf: dict[str, Any]) -> dict[str, Any]:
    model_type = hf.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise ConfigError(f"HF config: unknown model_type {model_type!r}; supported: {list(HF_MODEL_TYPES)}")
    if model_type == "qwen3_5_moe":
        if not isinstance(hf.get("text_config"), dict):
            raise ConfigError("HF config: model_type 'qwen3_5_moe' needs a 'text_config' mapping")
        text = dict(hf["text_config"])
        for key in ("tie_word_embeddings",):
            text.setdefault(key, hf.get(key, False))
        return text
    return dict(hf)


def _rope_fields(text: dict[str, Any]) -> dict[str, Any]:
    rope = dict(text.get("rope_parameters") or {})
    if text.get("rope_scaling"):
        raise _unsupported("rope_scaling", text["rope_scaling"], "only the default RoPE is implemented")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise _unsupported("rope_parameters.rope_type", rope_type, "only 'default' RoPE is implemented (no YaRN)")
    theta = rope.get("rope_theta", text.get("rope_theta", 10_000.0))
    factor = rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
    return {"rope_theta": float(theta), "partial_rotary_factor": float(factor)}


def _first_id(value: Any) -> int | None:
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else None
    return value


def from_hf_config(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from an HF config.json dict (`qwen3_5_moe` with nested text_config, or `qwen3_5_moe_text`).

    Keys transformers ignores (attn_output_gate, mtp_*, mamba_ssm_dtype, …) are ignored here too; values that would
    change the maths and are not implemented (another activation, attention bias, RoPE scaling) raise ConfigError.
    """
    text = _hf_text_config(hf)
    if text.get("hidden_act", "silu") != "silu":
        raise _unsupported("hidden_act", text["hidden_act"], "Qwen3.5 MoE uses SiLU everywhere")
    if text.get("attention_bias", False):
        raise _unsupported("attention_bias", True, "Qwen3.5 attention has no biases")
    names = {f.name for f in dataclasses.fields(ModelConfig)} - {"rope_theta", "partial_rotary_factor", *COMPUTE_FIELDS}
    kwargs = {k: text[k] for k in names if k in text and text[k] is not None}
    kwargs.update(_rope_fields(text))
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in kwargs:
            kwargs[key] = _first_id(kwargs[key])
    if "layer_types" in kwargs:
        kwargs["layer_types"] = tuple(kwargs["layer_types"])
    return from_dict(ModelConfig, kwargs, where="HF text_config")


def to_hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """The `qwen3_5_moe_text` config.json dict that transformers' Qwen3_5MoeForCausalLM loads."""
    skip = {"rope_theta", "partial_rotary_factor", "full_attention_interval", *COMPUTE_FIELDS}
    out: dict[str, Any] = {
        f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in skip
    }
    out["layer_types"] = list(cfg.layer_types)
    out.update(
        model_type="qwen3_5_moe_text",
        architectures=["Qwen3_5MoeForCausalLM"],
        hidden_act="silu",
        attention_bias=False,
        attention_dropout=0.0,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.partial_rotary_factor,
        },
    )
    return out


def preset_path(name: str) -> Path:
    return configs_dir() / "model" / f"{name}.yaml"


def preset_names() -> list[str]:
    return sorted(p.stem for p in (configs_dir() / "model").glob("*.yaml"))


def load_preset(name_or_path: str) -> ModelConfig:
    """A preset by name (configs/model/<name>.yaml) or a path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = preset_path(name_or_path)
        if not path.exists():
            raise ConfigError(f"unknown model preset {name_or_path!r}; available: {preset_names()}")
    try:
        return load_yaml(ModelConfig, path)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None
