"""`make demo` (the README's first command): `searchjax pipeline --config configs/pipeline/demo.yaml` runs every
stage of the recipe end to end, prints the evaluation table of the three policies, writes the tool-efficiency
curve, and a second run skips every stage."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from searchjax.config import configs_dir
from searchjax.pipeline import load_recipe, stages

DEMO = configs_dir() / "pipeline" / "demo.yaml"
STAGE_NAMES = [st.name for st in stages(load_recipe(DEMO))]


def _run(out):
    cmd = [sys.executable, "-m", "searchjax.cli.main", "pipeline", "--config", str(DEMO), "--out", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=""),
                          timeout=1800)


@pytest.mark.slow
def test_the_demo_recipe_runs_end_to_end_and_a_rerun_skips_every_stage(tmp_path):
    out = tmp_path / "demo"
    r = _run(out)
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

    again = _run(out)
    assert again.returncode == 0, again.stderr[-3000:]
    start = again.stdout.index('{\n "world"')  # the stage log lines, the JSON report, then the summary
    report = json.loads(again.stdout[start: again.stdout.index("\n}", start) + 2])
    assert report == {name: {"status": "skipped"} for name in STAGE_NAMES}
