"""`searchjax rollout` end to end: an HF checkpoint directory, a tantivy index and a QA JSONL → records."""

import argparse
import json
import os
import signal
import subprocess
import sys

import portpicker
import pytest

from searchjax import model as M
from searchjax.cli import main as cli_main
from searchjax.cli import rollout as rollout_cli
from searchjax.data.jsonl import write_jsonl as write_rows
import searchjax.rollout as rollout_pkg
from searchjax.rollout import read_jsonl
from searchjax.rollout.serve import decode
from searchjax.search import build_index


def _parser():
    parser = argparse.ArgumentParser(prog="searchjax")
    rollout_cli.register(parser.add_subparsers(dest="command"))
    return parser


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, cfg, params, tokenizer):
    """The tiny model as an HF checkpoint directory with its tokenizer.json."""
    path = tmp_path_factory.mktemp("model")
    M.save_hf(path, params, cfg)
    tokenizer.save(path / "tokenizer.json")
    return path


def test_rollout_command_writes_records_and_a_summary(tmp_path, model_dir, capsys, monkeypatch):
    corpus = tmp_path / "corpus.jsonl"
    write_rows(corpus, [{"title": "France", "url": "https://w.example/fr", "text": "Paris is the capital of France."}])
    build_index(str(corpus), str(tmp_path / "index"))
    prompts = tmp_path / "qa.jsonl"
    write_rows(prompts, [{"id": "q1", "question": "Capital of France?", "answer": "Paris"},
                         {"id": "q2", "question": "Which river flows through Bath?", "answer": "Avon"}])
    out = tmp_path / "records.jsonl"
    args_list = [
        "rollout", "--model", str(model_dir), "--index", str(tmp_path / "index"), "--prompts", str(prompts),
        "--group", "2", "--budget", "1", "--max-new-tokens", "5", "--temperature", "0.8", "--top-k", "50",
        "--seed", "3", "--slots", "4", "--max-len", "1024", "--max-prefill-length", "64", "--out", str(out),
    ]
    args = _parser().parse_args(args_list)
    assert args.func(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    records = read_jsonl(out)
    assert sorted((r.prompt_id, r.group_index) for r in records) == [("q1", 0), ("q1", 1), ("q2", 0), ("q2", 1)]
    assert summary["rollouts"] == 4 and summary["policy_tokens"] == sum(r.response_length for r in records)
    assert sum(summary["finish_reasons"].values()) == 4 and summary["tokens_per_s"] > 0
    assert "searchjax.cli.rollout" in cli_main.COMMAND_MODULES
    assert sorted(p.name for p in tmp_path.glob("records.jsonl*")) == ["records.jsonl"]

    # A run that dies after two finished rollouts keeps them, complete and readable, in OUT.partial.
    real = rollout_pkg.run_rollouts

    def dies_after_two(agent, items, group, key, reference, on_record):
        def record_then_maybe_die(record):
            on_record(record)
            if record_then_maybe_die.n == 1:
                raise RuntimeError("killed")
            record_then_maybe_die.n += 1

        record_then_maybe_die.n = 0
        return real(agent, items, group, key, reference, on_record=record_then_maybe_die)

    monkeypatch.setattr(rollout_pkg, "run_rollouts", dies_after_two)
    out2 = tmp_path / "killed.jsonl"
    args = _parser().parse_args([*args_list[:-2], "--out", str(out2)])
    with pytest.raises(RuntimeError, match="killed"):
        args.func(args)
    assert not out2.exists()
    kept = read_jsonl(tmp_path / "killed.jsonl.partial")
    assert len(kept) == 2 and all(r.response_length > 0 for r in kept)


def test_serve_binds_loopback_by_default():
    args = _parser().parse_args(["serve", "--model", "m"])
    assert (args.host, args.port, args.temperature, args.top_p, args.top_k) == ("127.0.0.1", 9000, 1.0, 1.0, 0)


def test_rollout_command_reports_a_missing_prompts_file(tmp_path, capsys):
    args = _parser().parse_args([
        "rollout", "--model", str(tmp_path), "--index", str(tmp_path), "--prompts", str(tmp_path / "none.jsonl"),
        "--group", "1", "--budget", "0", "--max-new-tokens", "1", "--seed", "0", "--out", str(tmp_path / "o"),
    ])
    assert args.func(args) == 1
    assert "none.jsonl" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_command_answers_decode_on_loopback(model_dir, tokenizer):
    port = portpicker.pick_unused_port()
    cmd = [sys.executable, "-m", "searchjax.cli.main", "serve", "--model", str(model_dir), "--port", str(port),
           "--slots", "2", "--max-len", "256", "--max-prefill-length", "64", "--temperature", "0"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = ""
        while "serving" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "searchjax serve exited before serving"
        assert f"127.0.0.1:{port}" in line
        text, ids = decode(f"127.0.0.1:{port}", text="Paris is the capital of", max_tokens=4, timeout_s=300)
        assert 1 <= len(ids) <= 4 and text == "".join(tokenizer.decode([i]) for i in ids)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert proc.returncode == 0
