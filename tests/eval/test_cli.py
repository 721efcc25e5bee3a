"""`searchjax eval`: input errors before any model is loaded, and a real kill (SIGKILL) resumed by a rerun."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from searchjax.cli.main import main


def _args(world, model_dir, out, *extra):
    return ["eval", "--model", f"random={model_dir}", "--index", str(world / "index"), "--questions",
            str(world / "qa.jsonl"), "--budgets", "0,2", "--out", str(out), "--max-new-tokens", "8", "--slots", "4",
            "--max-len", "2048", "--quiet", *extra]


def test_a_bad_question_row_fails_fast_naming_file_and_line(world, model_dir, tmp_path, capsys, monkeypatch):
    import searchjax.eval.harness as harness

    loaded = []  # fails before any model is loaded (a wall-clock bound here failed on a loaded machine)
    monkeypatch.setattr(harness, "load_policy", lambda *a, **k: loaded.append(a))
    bad = tmp_path / "qa.jsonl"
    bad.write_text('{"id": "a", "question": "Who?", "answer": "X"}\n{"id": "b", "question": "Who?"}\n')
    args = _args(world, model_dir, tmp_path / "out")
    args[args.index("--questions") + 1] = str(bad)
    assert main(args) == 1
    assert loaded == []
    err = capsys.readouterr().err
    assert f"error: {bad}:2: missing field 'answer'" in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, message", [
    (("--index", "/nonexistent/index"), "--index /nonexistent/index: no such directory"),
    (("--model", "random=/nonexistent/model"), "--model /nonexistent/model: no such directory"),
    (("--price-model", "nobody=qwen3.5-plus"), "no model labelled 'nobody'"),
    (("--price-model", "gpt-x"), "no model 'gpt-x'"),
    (("--baseline", "random"), "--baseline and --reward-model go together"),
    (("--benchmark", "simpleqa=/nonexistent.csv"), "/nonexistent.csv: no such file"),
])
def test_bad_inputs_are_one_line_errors(world, model_dir, tmp_path, capsys, change, message):
    args = _args(world, model_dir, tmp_path / "out")
    flag, value = change
    if flag == "--benchmark":
        i = args.index("--questions")
        del args[i : i + 2]
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    assert main(args) == 1
    assert message in capsys.readouterr().err


def test_bad_budgets_are_a_usage_error(world, model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(_args(world, model_dir, tmp_path / "out", "--budgets", "2-x"))
    assert e.value.code == 2 and "--budgets must look like" in capsys.readouterr().err


@pytest.mark.slow
def test_a_killed_run_resumes_without_redoing_finished_trajectories(world, model_dir, tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "searchjax.cli.main", *_args(world, model_dir, out)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    results = out / "results.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if results.exists() and len(results.read_text().splitlines()) >= 4:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = results.read_text().splitlines()
    n_questions = len((world / "qa.jsonl").read_text().splitlines())
    assert 4 <= len(before) < 2 * n_questions
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["resumed"] == len(before)
    assert report["run"]["random"]["trajectories"] == 2 * n_questions - len(before)
    after = results.read_text().splitlines()
    keys = [tuple(json.loads(line)[k] for k in ("question_id", "budget", "sample")) for line in after]
    assert len(keys) == len(set(keys)) == 2 * n_questions
    assert set(before) <= set(after)  # finished lines kept as they were
    assert len(done.stdout.strip().splitlines()) == 2  # one summary row per budget


def test_the_readme_lists_the_options_of_eval_help():
    import re
    from pathlib import Path

    from searchjax.cli.main import build_parser

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.sub(r"\\\n\s*", " ", readme.split("## Command line", 1)[1].split("```", 2)[1])
    (line,) = [x for x in block.splitlines() if x.startswith("searchjax eval ")]
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices and "eval" in a.choices)
    options = {s for a in sub.choices["eval"]._actions for s in a.option_strings if s.startswith("--")} - {"--help"}
    assert set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", line)) == options
