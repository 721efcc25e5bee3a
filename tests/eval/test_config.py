"""configs/eval: the default YAML is the write-up's settings and EvalConfig's defaults; bad values are errors."""

import dataclasses

import pytest

from searchjax.config import ConfigError, configs_dir, load_yaml
from searchjax.eval.harness import EvalConfig


def test_default_yaml_is_the_write_ups_settings():
    cfg = load_yaml(EvalConfig, configs_dir() / "eval" / "default.yaml")
    assert cfg == EvalConfig()
    assert (cfg.budgets, cfg.temperature, cfg.max_new_tokens) == (tuple(range(11)), 0.6, 8192)  # RECIPE.md §5


@pytest.mark.parametrize("change, match", [
    ({"budgets": (0, 0)}, "distinct"), ({"budgets": ()}, "distinct"), ({"samples": 0}, "samples"),
    ({"grader": "llm"}, "judge_url"), ({"top_p": 0.0}, "top_p"), ({"language_min_confidence": 2.0}, "confidence"),
])
def test_bad_settings_are_rejected(change, match):
    with pytest.raises(TypeError, match=match):
        dataclasses.replace(EvalConfig(), **change)


def test_a_bad_yaml_names_the_file(tmp_path):
    p = tmp_path / "eval.yaml"
    p.write_text("budgets: [0, 1]\ntemprature: 0.7\n")
    with pytest.raises(ConfigError, match="eval.yaml.*unknown key.*temprature"):
        load_yaml(EvalConfig, p)
