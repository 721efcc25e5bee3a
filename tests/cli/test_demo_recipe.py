"""`make demo` (the README's first command): `searchjax pipeline --config configs/pipeline/demo.yaml` runs every
stage of the recipe end to end, prints the evaluation table of the three policies, writes the tool-efficiency
curve, and a second run skips every stage.

The test runs the demo recipe with fewer training steps, questions, pairs and documents (`SHRINK`, `OVERRIDES`):
the same stages, commands, configs and batch widths. In the suite it took 465 s where the full demo took 814 s
(its longest test; session 17, BENCHMARKS.md). The demo's own sizes load and chain in tests/test_pipeline.py."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
import yaml

from searchjax.config import configs_dir
from searchjax.pipeline import load_recipe, stages

DEMO = configs_dir() / "pipeline" / "demo.yaml"
STAGE_NAMES = [st.name for st in stages(load_recipe(DEMO))]
# Sizes of the shrunken demo: every training stage runs a few steps at the demo's batch widths (its buckets and
# max_len stay), the evaluation two held-out questions at every budget.
SHRINK = {"world_docs": 600, "questions": 24, "rubric_prompts": 8, "pairs_per_category": 6, "eval_questions": 2,
          "eval_max_new_tokens": 48}
OVERRIDES = {"lm": ["steps=4"], "sft": ["steps=3"], "grpo": ["steps=2"],
             "rm": ["steps=3", "freeze_backbone_steps=1", "data.window_batches=2"]}


def _recipe(tmp_path):
    recipe = yaml.safe_load(DEMO.read_text())
    recipe.update(SHRINK)
    for stage, extra in OVERRIDES.items():
        recipe[stage]["overrides"] = [*recipe[stage].get("overrides", []), *extra]
    path = tmp_path / "demo_small.yaml"
    path.write_text(yaml.safe_dump(recipe))
    load_recipe(path)  # the recipe's own checks
    return path


def _run(recipe, out):
    cmd = [sys.executable, "-m", "searchjax.cli.main", "pipeline", "--config", str(recipe), "--out", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=""),
                          timeout=1800)


@pytest.mark.slow
def test_the_demo_recipe_runs_end_to_end_and_a_rerun_skips_every_stage(tmp_path):
    out, recipe = tmp_path / "demo", _recipe(tmp_path)
    r = _run(recipe, out)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    for name in STAGE_NAMES:
        assert json.loads((out / name / "stage.json").read_text())["hash"], name
    with open(out / "eval" / "eval" / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(row["model"], int(row["budget"])) for row in rows} == {
        (m, b) for m in ("start", "sft", "sft+rl") for b in range(11)}
    for row in rows:
        assert 0 <= float(row["accuracy"]) <= 1 and float(row["mean_tool_calls"]) >= 0
    assert (out / "eval" / "eval" / "tool_efficiency.png").stat().st_size > 1000
    assert "tool_efficiency.png" in r.stdout and f"tensorboard --logdir {out}" in r.stdout
    for stage in ("lm", "sft", "rm", "grpo"):  # every training stage logged its curves
        assert list((out / stage / "run" / "tb").iterdir()), stage

    again = _run(recipe, out)
    assert again.returncode == 0, again.stderr[-3000:]
    start = again.stdout.index('{\n "world"')  # the stage log lines, the JSON report, then the summary
    report = json.loads(again.stdout[start: again.stdout.index("\n}", start) + 2])
    assert report == {name: {"status": "skipped"} for name in STAGE_NAMES}
