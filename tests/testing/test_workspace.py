"""searchjax.testing.workspace: the pipeline output's layout and the fallback to a tiny workspace.

Building the tiny workspace itself is exercised by the notebook tests (tests/test_notebooks.py) and its data by
the training tests (tests/train/conftest.py)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from searchjax.chat import train_tokenizer
from searchjax.model import init_params, load_hf, load_preset
from searchjax.testing.workspace import pipeline_workspace, tiny_policy, workspace

# What `searchjax pipeline` leaves under OUT (searchjax/pipeline.py, the stages' `produces`).
STAGE_OUTPUTS = ("sft/run/final/config.json", "rm/run/final/config.json", "index/index/meta.json", "qa/qa.jsonl",
                 "rubric/rubric.jsonl", "heldout/heldout.jsonl")


def _pipeline_out(root, *paths):
    for p in paths:
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        (root / p).write_text("{}")
    return root


def test_pipeline_workspace_names_the_stage_outputs(tmp_path):
    ws = pipeline_workspace(_pipeline_out(tmp_path, *STAGE_OUTPUTS))
    assert ws.policy == ws.reference == tmp_path / "sft/run/final"
    assert ws.reward_model == tmp_path / "rm/run/final" and ws.index == tmp_path / "index/index"
    assert ws.prompts == (tmp_path / "qa/qa.jsonl", tmp_path / "rubric/rubric.jsonl")
    assert ws.questions == tmp_path / "heldout/heldout.jsonl"
    assert ws.trained is None  # no grpo stage yet
    _pipeline_out(tmp_path, "grpo/run/final/config.json")
    assert pipeline_workspace(tmp_path).trained == tmp_path / "grpo/run/final"
    assert workspace(tmp_path, tmp_path / "unused") == pipeline_workspace(tmp_path)


def test_an_unfinished_pipeline_output_is_refused_naming_what_is_missing(tmp_path):
    _pipeline_out(tmp_path, *STAGE_OUTPUTS[:-1])
    with pytest.raises(FileNotFoundError, match="heldout.jsonl"):
        pipeline_workspace(tmp_path)


def test_tiny_policy_is_the_tiny_preset_from_the_key_with_its_tokenizer(tmp_path):
    (tmp_path / "corpus.txt").write_text("The river Avon flows through the city of Bath.\n" * 50)
    tokenizer = train_tokenizer([str(tmp_path / "corpus.txt")], 400, str(tmp_path / "tokenizer.json"))
    path = tiny_policy(tmp_path / "policy", tmp_path / "tokenizer.json", jax.random.key(3))
    cfg, params = load_hf(path)
    assert cfg == load_preset("tiny").replace(vocab_size=tokenizer.vocab_size)
    want = init_params(cfg, jax.random.key(3))
    jax.tree.map(np.testing.assert_array_equal, params, want)
    assert (path / "tokenizer.json").read_bytes() == (tmp_path / "tokenizer.json").read_bytes()
