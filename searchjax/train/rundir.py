"""The run directory every stage writes, and the start / resume / overwrite rule.

    RUN/run.json        {"stage": ..., "format": 1}: marks the directory as a searchjax run of that stage
    RUN/config.yaml     the resolved config (YAML + overrides, every default filled in)
    RUN/metrics.jsonl   one object per logged step, always with "step"
    RUN/tb/             tensorboardX event files
    RUN/checkpoints/    orbax checkpoints (searchjax.train.checkpoint)
    RUN/final/          the final model in HF format (plus tokenizer.json)

A start on a missing or empty directory begins a fresh run. A start on a run directory of the same stage resumes
it, provided its config.yaml equals the resolved config (else it refuses, naming the keys that differ); keys that
change only the display (`DISPLAY_ONLY`: the progress bar) may differ.
`overwrite=True` removes the directory and begins afresh. Anything else (foreign files, another stage) refuses
with a message, before any work starts.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import jax
import yaml

from searchjax.atomic import atomic_write_text
from searchjax.config import ConfigError, to_dict

FORMAT = 1


@dataclasses.dataclass(frozen=True)
class RunDir:
    """Paths of one run directory; `resuming` is True when it already held this run."""

    root: Path
    resuming: bool

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def final(self) -> Path:
        return self.root / "final"

    @property
    def tb(self) -> Path:
        return self.root / "tb"


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


DISPLAY_ONLY = frozenset({"progress"})  # keys a resume may change: they alter what is shown, never what is computed


def config_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two resolved configs."""
    a, b = _flatten(old), _flatten(new)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def prepare_run_dir(out: str | Path, stage: str, cfg: Any, overwrite: bool = False) -> RunDir:
    """Create, resume or refuse RUN (see module docstring). Only process 0 writes; every process gets the same
    answer: with several processes, barriers make every process decide before process 0 changes anything."""
    root = Path(out)
    resolved = to_dict(cfg)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--out {root}: exists and is not a directory")
    # Every process reads the directory before process 0 changes it (a process that looked after process 0 had
    # created RUN, and before run.json was written, would refuse a directory the others are starting in).
    _barrier("rundir_read")
    if overwrite and root.exists() and jax.process_index() == 0:
        shutil.rmtree(root)
    try:
        run = _decide(root, stage, resolved, overwrite)
    finally:
        _barrier("rundir_decided")
    if not run.resuming and jax.process_index() == 0:
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(root / "config.yaml", yaml.safe_dump(resolved, sort_keys=False))
        atomic_write_text(root / "run.json", json.dumps({"stage": stage, "format": FORMAT}) + "\n")
    _barrier("rundir_written")
    return run


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(f"searchjax_{name}")


def _decide(root: Path, stage: str, resolved: dict[str, Any], overwrite: bool) -> RunDir:
    """Resume (RUN holds this stage's run with this config), start afresh (RUN missing, empty, or being
    overwritten by process 0), or refuse."""
    if overwrite:
        return RunDir(root, resuming=False)
    marker = root / "run.json"
    if root.exists() and any(root.iterdir()):
        if not marker.exists():
            raise ConfigError(f"--out {root}: exists and is not a searchjax run directory (no run.json); choose an "
                              "empty or new directory, or pass --overwrite to replace it")
        meta = json.loads(marker.read_text())
        if meta.get("stage") != stage:
            raise ConfigError(f"--out {root}: holds a {meta.get('stage')!r} run, not {stage!r}; pass --overwrite "
                              "to replace it")
        old = yaml.safe_load((root / "config.yaml").read_text()) if (root / "config.yaml").exists() else {}
        diff = [k for k in config_diff(old or {}, resolved) if k not in DISPLAY_ONLY]
        if diff:
            raise ConfigError(f"--out {root}: its config.yaml differs from this run's config in {diff[:8]}; resume "
                              "with the same config, or pass --overwrite to start afresh")
        return RunDir(root, resuming=True)
    return RunDir(root, resuming=False)
