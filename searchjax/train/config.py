"""Typed configs shared by every training stage (SFT, LM pretraining, reward model, GRPO).

A stage's config is a frozen dataclass that extends `TrainConfig` with its own sections; YAML files in
configs/train/ load through `load_train_config`, which applies dotted command-line overrides
(`optim.learning_rate=1e-3`) on top of the YAML with the same type checks as the file itself (an unknown key lists
the valid ones).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from searchjax.config import ConfigError, from_dict, read_yaml_mapping
from searchjax.distributed import DistributedConfig

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with warmup + decay, global-norm clipping and gradient accumulation.

        lr(t) = peak · t / warmup                                   for t < warmup
        lr(t) = end + (peak − end) · ½(1 + cos(π (t − warmup) / (steps − warmup)))     (cosine)
        lr(t) = peak + (end − peak) · (t − warmup) / (steps − warmup)                   (linear)
        lr(t) = peak                                                                     (constant)
    with end = peak · end_lr_ratio. Weight decay applies to matrices only (rank ≥ 2), never to norms, biases or
    the per-head DeltaNet scalars. `micro_batches` splits each batch into that many sequential micro-batches whose
    gradients are accumulated (weighted by their token counts) before one update.
    """

    learning_rate: float = 3e-4
    warmup_steps: int = 0
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    end_lr_ratio: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip_norm: float | None = 1.0
    micro_batches: int = 1

    def __post_init__(self):
        if self.learning_rate <= 0 or not 0 <= self.end_lr_ratio <= 1:
            raise TypeError(f"optim: learning_rate > 0 and 0 <= end_lr_ratio <= 1 required, got "
                            f"{self.learning_rate}, {self.end_lr_ratio}")
        if self.warmup_steps < 0 or self.micro_batches < 1:
            raise TypeError(f"optim: warmup_steps >= 0 and micro_batches >= 1 required, got "
                            f"{self.warmup_steps}, {self.micro_batches}")
        if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1 and self.eps > 0 and self.weight_decay >= 0):
            raise TypeError(f"optim: 0 <= b1, b2 < 1, eps > 0, weight_decay >= 0 required, got {self}")
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise TypeError(f"optim.clip_norm must be > 0 or null, got {self.clip_norm}")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints: keep the newest `keep`, plus the `keep_best` best by `best_metric` (an eval metric name
    such as "dev/loss"; null keeps no best), saved asynchronously."""

    keep: int = 2
    best_metric: str | None = None
    best_mode: Literal["min", "max"] = "min"
    keep_best: int = 1
    async_save: bool = True

    def __post_init__(self):
        if self.keep < 1 or self.keep_best < 1:
            raise TypeError(f"checkpoint: keep >= 1 and keep_best >= 1 required, got {self.keep}, {self.keep_best}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What every stage shares. `steps` counts optimizer steps in total; `batch_size` is the global batch (rows
    per optimizer step, over all processes); `eval_every`/`save_every` 0 means only at the end.

    mesh: sizes of mesh axes (data, fsdp, tensor, expert); one may be -1 (the rest of the devices); empty = all
    devices on fsdp. compute_dtype "bfloat16" runs the forward/backward with matrices cast to bf16 while the
    master weights and the optimizer state stay float32. peak_flops_per_device is the denominator of the MFU
    estimate (model FLOPs/s ÷ peak; the default is this 2-core CPU's measured fp32 matmul peak).
    """

    steps: int = 100
    batch_size: int = 8
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0
    save_every: int = 0
    optim: OptimConfig = OptimConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    mesh: dict[str, int] = dataclasses.field(default_factory=dict)
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    remat: bool = False
    peak_flops_per_device: float = 2.5e11
    progress: bool = True
    distributed: DistributedConfig = DistributedConfig()

    def __post_init__(self):
        if self.steps < 1 or self.batch_size < 1 or self.log_every < 1:
            raise TypeError(f"steps, batch_size and log_every must be >= 1, got {self.steps}, {self.batch_size}, "
                            f"{self.log_every}")
        if self.eval_every < 0 or self.save_every < 0:
            raise TypeError(f"eval_every and save_every must be >= 0, got {self.eval_every}, {self.save_every}")
        if self.batch_size % self.optim.micro_batches:
            raise TypeError(f"batch_size {self.batch_size} is not a multiple of optim.micro_batches "
                            f"{self.optim.micro_batches}")


def _parse_value(text: str) -> Any:
    """A command-line value as YAML would read it (numbers, booleans, null, lists), else the plain string; "1e-4"
    is a float too (YAML 1.1 wants "1.0e-4")."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str], cls: type) -> dict[str, Any]:
    """`key.sub=value` strings applied on top of the mapping `data` for config class `cls`.

    Each key is checked against the dataclass fields on the way down, so `optim.lr=1` fails with the valid keys of
    `optim`; the value is parsed as YAML (so `1e-3` is a float, `null` is None) and type-checked by from_dict.
    """
    out = dict(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected key.sub=value")
        parts = key.split(".")
        node, node_cls = out, cls
        for depth, part in enumerate(parts):
            fields = {f.name: f for f in dataclasses.fields(node_cls)} if dataclasses.is_dataclass(node_cls) else None
            if fields is not None and part not in fields:
                where = ".".join(parts[:depth]) or node_cls.__name__
                raise ConfigError(f"override {item!r}: unknown key {part!r} in {where}; valid keys are "
                                  f"{sorted(fields)}")
            if depth == len(parts) - 1:
                node[part] = _parse_value(raw)
                break
            child = node.get(part)
            if not isinstance(child, dict):
                default = getattr(node_cls(), part) if fields is not None and _constructible(node_cls) else None
                child = _as_dict(default)
            node[part] = child = dict(child)
            node = child
            node_cls = _field_type(node_cls, part) if fields is not None else None
    return out


def _constructible(cls: type) -> bool:
    try:
        cls()
        return True
    except TypeError:
        return False


def _as_dict(value: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(value):
        from searchjax.config import to_dict

        return to_dict(value)
    return dict(value) if isinstance(value, dict) else {}


def _field_type(cls: type, name: str) -> type | None:
    import typing

    tp = typing.get_type_hints(cls)[name]
    return tp if dataclasses.is_dataclass(tp) else None


def load_train_config(cls: type[T], path: str | Path | None, overrides: Sequence[str] = ()) -> T:
    """The stage config `cls` from a YAML file (or the defaults when path is None) plus dotted overrides."""
    data: dict[str, Any] = {}
    where = cls.__name__
    if path is not None:
        where = str(path)
        data = read_yaml_mapping(path, allow_empty=True)
    data = apply_overrides(data, overrides, cls)
    try:
        return from_dict(cls, data, where=where)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:  # a dataclass's own __post_init__ check
        raise ConfigError(f"{where}: {e}") from None
