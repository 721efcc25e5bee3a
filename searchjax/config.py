"""YAML -> frozen dataclasses.

Every config in searchjax is a frozen dataclass. `from_dict` builds one from a mapping (recursively for nested
dataclass fields), rejecting unknown keys with a message that lists the valid ones, and checking scalar types
(int, float, bool, str, tuples and Optional of those) so a typo in a YAML file fails at load time, not deep in a
jitted function.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value or key is wrong; the message names where and what was expected."""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check (and lightly coerce: int -> float, list -> tuple) `value` against the annotation `tp`."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{where}: expected {tp}, got {value!r} ({type(value).__name__})")
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: expected one of {list(allowed)}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r} ({type(value).__name__})")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        kt, vt = typing.get_args(tp) or (Any, Any)
        return {_coerce(k, kt, f"{where}.key"): _coerce(v, vt, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {value!r}")
        return from_dict(tp, value, where=where)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected float, got {value!r} ({type(value).__name__})")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected int, got {value!r} ({type(value).__name__})")
        return value
    if tp in (bool, str):
        if not isinstance(value, tp):
            raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")
        return value
    return value


def from_dict(cls: type[T], data: dict[str, Any], *, where: str | None = None) -> T:
    """Build the frozen dataclass `cls` from `data`; unknown keys and wrong types raise ConfigError."""
    where = where or cls.__name__
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {unknown}; valid keys are {sorted(fields)}"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(value, hints[name], f"{where}.{name}")
    missing = [
        n for n, f in fields.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{where}: missing required key(s) {missing}")
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    """The inverse of from_dict: a plain dict (tuples as lists) ready for yaml.safe_dump."""

    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v) if f.init}
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v

    return conv(cfg)


def read_yaml_mapping(path: str | Path, allow_empty: bool = False) -> dict[str, Any]:
    """The top-level mapping of a YAML file (an empty file is {} when `allow_empty`); errors name the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    if data is None and allow_empty:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def load_yaml(cls: type[T], path: str | Path) -> T:
    """Load a YAML file into the frozen dataclass `cls`; errors name the file."""
    path = Path(path)
    data = read_yaml_mapping(path)
    try:
        return from_dict(cls, data, where=str(path))
    except ConfigError:
        raise  # already names the file and the field
    except (TypeError, ValueError) as e:  # a dataclass's own __post_init__ validation
        raise ConfigError(f"{path}: {e}") from None


def configs_dir() -> Path:
    """The repository's configs/ directory (YAML presets shipped with the project)."""
    return Path(__file__).resolve().parent.parent / "configs"
