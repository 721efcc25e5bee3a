"""Every configs/train/*.yaml loads into its stage's config; dotted overrides are typed and checked."""

from __future__ import annotations

import pytest

from searchjax.config import ConfigError, configs_dir
from searchjax.train.config import load_train_config
from searchjax.train.sft import SFTConfig
from searchjax.train.stages import STAGES

TRAIN_CONFIGS = sorted((configs_dir() / "train").glob("*.yaml"))


def test_there_are_train_configs():
    names = {p.name for p in TRAIN_CONFIGS}
    assert {"sft_tiny.yaml", "sft_science.yaml", "lm_tiny.yaml", "lm_science.yaml"} <= names


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=lambda p: p.name)
def test_every_train_config_loads(path):
    stage = path.name.split("_", 1)[0]
    assert stage in STAGES, f"{path.name}: the file name must start with a stage name, one of {sorted(STAGES)}"
    cfg = load_train_config(STAGES[stage].load().Config, path)
    for field in ("steps", "batch_size", "seed", "log_every", "eval_every", "save_every"):
        assert getattr(cfg, field) is not None


def test_overrides_are_typed_and_nested():
    cfg = load_train_config(SFTConfig, configs_dir() / "train" / "sft_tiny.yaml",
                            ["optim.learning_rate=1e-4", "data.buckets=[128, 256]", "checkpoint.best_metric=null",
                             "mesh={fsdp: 2}", "steps=7"])
    assert cfg.optim.learning_rate == 1e-4 and cfg.data.buckets == (128, 256) and cfg.steps == 7
    assert cfg.checkpoint.best_metric is None and cfg.mesh == {"fsdp": 2}
    assert cfg.optim.warmup_steps == 5  # the rest of the YAML's section is kept


@pytest.mark.parametrize("override, fragment", [
    ("optim.lr=1", "unknown key 'lr' in optim; valid keys are ['b1', 'b2'"),
    ("data.max_len=x", "expected int"),
    ("steps=0", "steps, batch_size and log_every must be >= 1"),
    ("batch_size=6", "not a multiple of optim.micro_batches"),
])
def test_bad_overrides(override, fragment):
    extra = ["optim.micro_batches=4"] if override.startswith("batch_size") else []
    with pytest.raises(ConfigError, match=None) as e:
        load_train_config(SFTConfig, configs_dir() / "train" / "sft_tiny.yaml", [override, *extra])
    assert fragment in str(e.value), str(e.value)
