"""Every notebook under notebooks/ runs top to bottom in a real Jupyter kernel (nbclient) on tiny settings.

The test keeps each notebook's cell tagged `parameters` and inserts a cell after it that sets the tiny values
(papermill's convention), runs the notebook in a fresh `python3` kernel with JAX on the CPU and no fake devices
(the kernel gets its own environment, not this process's 8-device XLA_FLAGS), and checks what the notebook
wrote into its OUT directory. A cell that raises fails the test with the cell's traceback. The GRPO and eval
notebooks share one persistent compilation cache (per pytest worker), so kernels both need compile once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
# Tiny settings per notebook (OUT is added by the test). The GRPO and eval notebooks build a tiny workspace.
TINY = {
    "reward_shaping.ipynb": {"SWEEP_POINTS": 4},
    "ablation_run.ipynb": {"STEPS": 2, "COMMON": ["batch_size=2", "rollout.group_size=2",
                                                   "rollout.max_new_tokens=16", "rollout.slots=4"]},
    "eval_sweep.ipynb": {"BUDGETS": [0, 1, 2], "QUESTIONS": 2, "MAX_NEW_TOKENS": 8, "SLOTS": 4, "MAX_LEN": 2048},
}
CACHED = ("ablation_run.ipynb", "eval_sweep.ipynb")  # notebooks with a COMPILE_CACHE parameter


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("xla_cache")


def _read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOK_DIR / name, as_version=4)


def execute(name: str, tmp_path: Path, compile_cache: Path | None = None) -> tuple[nbformat.NotebookNode, Path]:
    """Run notebook `name` with its TINY parameters (and COMPILE_CACHE, when given) in a kernel whose working
    directory is tmp_path; returns the executed notebook and its OUT directory."""
    nb = _read(name)
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    tags = nb.cells[code[0]].metadata.get("tags", [])
    assert "parameters" in tags, f"{name}: the first code cell is not tagged parameters"
    out = tmp_path / "out"
    values = {**TINY[name], "OUT": str(out), **({"COMPILE_CACHE": str(compile_cache)} if compile_cache else {})}
    injected = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in values.items()))
    injected.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(code[0] + 1, injected)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                   ).execute(env=env)
    return nb, out


def _images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_every_notebook_has_tiny_settings_and_no_committed_outputs():
    assert sorted(p.name for p in NOTEBOOKS) == sorted(TINY)
    for path in NOTEBOOKS:
        nb = _read(path.name)
        nbformat.validate(nb)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            assert not cell.outputs and cell.execution_count is None, f"{path.name} cell {i}: outputs committed"
            assert not any(line.lstrip().startswith(("%", "!")) for line in cell.source.splitlines()), (
                f"{path.name} cell {i}: IPython magics/shell escapes are not allowed (plain Python only)")
        params = next(c for c in nb.cells if c.cell_type == "code")
        names = {line.split("=")[0].strip() for line in params.source.splitlines() if "=" in line}
        want = set(TINY[path.name]) | {"OUT"} | ({"COMPILE_CACHE"} if path.name in CACHED else set())
        assert want <= names, f"{path.name}: parameters lack {want - names}"


def test_reward_shaping_notebook(tmp_path):
    nb, out = execute("reward_shaping.ipynb", tmp_path)
    s = json.loads((out / "summary.json").read_text())
    assert s["groups"] == 8 and s["group_size"] == 4 and 0 < s["winners"] < 32
    assert s["gated"]["max_wrong_reward"] <= 0.0  # the gate: a wrong answer never earns a positive reward
    assert all(r > 0 for r in s["linear"]["max_wrong_reward"])  # ... the linear sum pays for it
    sweeps = s["sweeps"]
    assert set(sweeps) == {"alpha_win", "alpha_lose", "beta_lose", "lambda_tool", "lambda_len"}
    for name, sw in sweeps.items():
        assert len(sw["values"]) == 4, name
        for who in ("winners", "losers"):  # every coefficient only ever adds penalty
            assert all(b <= a + 1e-6 for a, b in zip(sw[f"reward_{who}"], sw[f"reward_{who}"][1:])), (name, who)
    assert len(set(sweeps["alpha_win"]["reward_losers"])) == 1  # α_win touches winners only
    assert len(set(sweeps["beta_lose"]["reward_winners"])) == 1  # β_lose touches losers only
    assert s["figures"] == ["anchored_vs_unconditional.png", "gated_vs_linear.png", "sweeps.png"]
    assert _images(nb) == 3


@pytest.mark.slow
def test_ablation_run_notebook(tmp_path, compile_cache):
    nb, out = execute("ablation_run.ipynb", tmp_path, compile_cache)
    s = json.loads((out / "summary.json").read_text())
    assert set(s["runs"]) == {"gated", "linear"}
    for name, run in s["runs"].items():
        assert run["steps"] == [1, 2], name
        assert (out / name / "final" / "config.json").is_file()
    assert s["step1_same_rollouts"]  # same weights and keys at step 1: only the reward differs
    gated, linear = (s["runs"][k]["metrics"] for k in ("gated", "linear"))
    assert gated["reward/score/mean"][0] != linear["reward/score/mean"][0]
    assert _images(nb) == 1


@pytest.mark.slow
def test_eval_sweep_notebook(tmp_path, compile_cache):
    nb, out = execute("eval_sweep.ipynb", tmp_path, compile_cache)
    s = json.loads((out / "summary.json").read_text())
    assert s["models"] == ["policy"] and s["budgets"] == [0, 1, 2]
    assert [(r["model"], r["budget"]) for r in s["rows"]] == [("policy", b) for b in (0, 1, 2)]
    for row in s["rows"]:
        assert row["n"] == 2 and 0.0 <= row["accuracy"] <= 1.0 and row["mean_tool_calls"] >= 0.0
    assert (out / "eval" / "tool_efficiency.png").is_file() and (out / "eval" / "summary.csv").is_file()
    assert _images(nb) == 1
