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
from searchjax.data.jsonl import read_jsonl as read_rows
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
    """Through the HTTP search service (--index URL); a prompt too long for --max-len is warned about."""
    from searchjax.search import SearchHTTPServer, TantivyBackend
    from searchjax.search.http import serving_in_background

    corpus = tmp_path / "corpus.jsonl"
    write_rows(corpus, [{"title": "France", "url": "https://w.example/fr", "text": "Paris is the capital of France."}])
    build_index(str(corpus), str(tmp_path / "index"))
    prompts = tmp_path / "qa.jsonl"
    write_rows(prompts, [{"id": "q1", "question": "Capital of France?", "answer": "Paris"},
                         {"id": "q2", "question": "Which river flows through Bath?", "answer": "Avon"},
                         {"id": "long", "question": "Which river? " * 400, "answer": "Avon"}])
    out = tmp_path / "records.jsonl"
    service = serving_in_background(SearchHTTPServer(TantivyBackend(tmp_path / "index"), port=0))
    server = service.__enter__()
    args_list = [
        "rollout", "--model", str(model_dir), "--index", server.url, "--prompts", str(prompts),
        "--group", "2", "--budget", "1", "--max-new-tokens", "5", "--temperature", "0.8", "--top-k", "50",
        "--seed", "3", "--slots", "4", "--max-len", "1024", "--max-prefill-length", "64", "--out", str(out),
    ]
    try:
        args = _parser().parse_args(args_list)
        assert args.func(args) == 0
        captured = capsys.readouterr()
    finally:
        service.__exit__(None, None, None)
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert "warning: prompt 'long' has" in captured.err and "fill --max-len 1024" in captured.err
    assert "compiling the engine's kernels" in captured.err and summary["compile_s"] > 0
    records = read_jsonl(out)
    assert sorted((r.prompt_id, r.group_index) for r in records if r.prompt_id != "long") == [
        ("q1", 0), ("q1", 1), ("q2", 0), ("q2", 1)]
    assert {r.finish_reason for r in records if r.prompt_id == "long"} == {"context"}
    assert summary["rollouts"] == 6 and summary["policy_tokens"] == sum(r.response_length for r in records)
    assert sum(summary["finish_reasons"].values()) == 6 and summary["tokens_per_s"] > 0
    args_list[4] = str(tmp_path / "index")  # the rest runs on the index directory, without the long prompt
    write_rows(prompts, read_rows(prompts)[0][:2])
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
    assert "the 2 rollouts that finished are kept in" in capsys.readouterr().err


def test_serve_binds_loopback_by_default():
    args = _parser().parse_args(["serve", "--model", "m"])
    assert (args.host, args.port, args.temperature, args.top_p, args.top_k) == ("127.0.0.1", 9000, 1.0, 1.0, 0)


def test_serve_exits_past_a_server_that_does_not_stop(monkeypatch, model_dir, capsys):
    """Ctrl-C, and a stop that reports stuck threads: the command says what and leaves (os._exit) instead of
    hanging in the interpreter's exit-time joins."""
    import searchjax.rollout.serve as serve

    class Stuck:
        port = 1

        def __init__(self, *args, **kwargs):
            pass

        def wait_for_termination(self):
            raise KeyboardInterrupt

        def stop(self):
            return ["JetStream's driver threads"]

    def leave(code):
        raise SystemExit(f"os._exit({code})")

    monkeypatch.setattr(serve, "RolloutServer", Stuck)
    monkeypatch.setattr(rollout_cli, "_engine", lambda args, sampling: None)
    monkeypatch.setattr(rollout_cli.os, "_exit", leave)
    args = _parser().parse_args(["serve", "--model", str(model_dir)])
    with pytest.raises(SystemExit, match=r"os\._exit\(0\)"):
        args.func(args)
    assert "JetStream's driver threads did not stop within 30 s" in capsys.readouterr().err


def test_rollout_command_reports_a_missing_prompts_file(tmp_path, model_dir, capsys):
    args = _parser().parse_args([
        "rollout", "--model", str(model_dir), "--index", str(tmp_path), "--prompts", str(tmp_path / "none.jsonl"),
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
        # SIGTERM, which the CLI turns into KeyboardInterrupt as it does Ctrl-C: a process started in the
        # background by a non-interactive shell inherits SIGINT ignored (POSIX), and so did the whole suite when
        # session 19 started it that way: SIGINT never arrived and the wait ran out.
        proc.send_signal(signal.SIGTERM)
        try:  # a clean exit is the check; the server's stop waits at most 30 s for each of its parts
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()  # no server left behind
            raise
    assert proc.returncode == 0


def _small_index(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    write_rows(corpus, [{"title": "France", "url": "https://w.example/fr", "text": "Paris is the capital."}])
    build_index(corpus, tmp_path / "index", progress=False)
    return tmp_path / "index"


def _rollout_argv(tmp_path, model_dir, index, **over):
    prompts = tmp_path / "qa.jsonl"
    if not prompts.exists():
        write_rows(prompts, [{"id": "q1", "question": "Capital of France?", "answer": "Paris"}])
    flags = {"--model": model_dir, "--index": index, "--prompts": prompts, "--group": 1, "--budget": 1,
             "--max-new-tokens": 4, "--seed": 0, "--out": tmp_path / "r.jsonl", "--max-len": 1024,
             "--max-prefill-length": 64, "--slots": 2} | over
    return ["rollout", *(str(x) for kv in flags.items() for x in kv)]


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if the command gets as far as loading the model."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(rollout_pkg.SearchJaxEngine, "from_dir", classmethod(refuse))


@pytest.mark.parametrize("flag, value", [("--group", "0"), ("--group", "-1"), ("--max-new-tokens", "0"),
                                         ("--top-p", "0"), ("--temperature", "-1"), ("--slots", "0")])
def test_rollout_bad_counts_are_one_line_usage_errors(tmp_path, model_dir, flag, value, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main.main(_rollout_argv(tmp_path, model_dir, tmp_path, **{flag: value}))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and flag in err and "Traceback" not in err


def _fails(capsys, argv, match):
    assert cli_main.main(argv) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], err
    return lines[0]


def test_rollout_checks_every_input_and_output_before_loading_the_model(tmp_path, model_dir, capsys,
                                                                          no_model_load):
    index = _small_index(tmp_path)
    _fails(capsys, _rollout_argv(tmp_path, model_dir, tmp_path / "nope"), "--index")
    _fails(capsys, _rollout_argv(tmp_path, model_dir, tmp_path), "not a searchjax index")
    _fails(capsys, _rollout_argv(tmp_path, model_dir, index, **{"--out": tmp_path / "r" / "x.jsonl"}),
           "does not exist")
    (tmp_path / "r").mkdir()
    _fails(capsys, _rollout_argv(tmp_path, model_dir, index, **{"--out": tmp_path / "r"}), "is a directory")
    assert sorted(p.name for p in tmp_path.glob("r*")) == ["r"]
    _fails(capsys, _rollout_argv(tmp_path, tmp_path / "nomodel", index), "--model")
    _fails(capsys, _rollout_argv(tmp_path, model_dir, index, **{"--reference-model": tmp_path}), "config.json")
    bad = tmp_path / "bad.jsonl"
    write_rows(bad, [{"id": "q1", "question": "ok?"}, {"id": "q2", "question": 5}])
    _fails(capsys, _rollout_argv(tmp_path, model_dir, index, **{"--prompts": bad}),
           f"{bad}:2: field 'question': expected str, got int")
    write_rows(bad, [{"question": "no id?"}])
    _fails(capsys, _rollout_argv(tmp_path, model_dir, index, **{"--prompts": bad}), f"{bad}:1: missing field 'id'")
    bad.write_text("")
    _fails(capsys, _rollout_argv(tmp_path, model_dir, index, **{"--prompts": bad}), "no prompt")
    (tmp_path / "r.jsonl").write_text("old\n")
    _fails(capsys, _rollout_argv(tmp_path, model_dir, index), "exists (pass --overwrite")
    assert (tmp_path / "r.jsonl").read_text() == "old\n"


def test_truncated_safetensors_is_named_by_rollout_and_serve(tmp_path, model_dir, capsys):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])
    index = _small_index(tmp_path)
    _fails(capsys, _rollout_argv(tmp_path, broken, index), f"{weights}: not a readable safetensors file")
    _fails(capsys, ["serve", "--model", str(broken), "--port", "0"], f"{weights}: not a readable safetensors file")


def test_rollout_fails_before_the_run_when_no_prompt_fits(tmp_path, model_dir, capsys, monkeypatch):
    def no_run(*args, **kwargs):
        raise AssertionError("rollouts ran although no prompt fits")

    monkeypatch.setattr(rollout_pkg, "run_rollouts", no_run)
    assert cli_main.main(_rollout_argv(tmp_path, model_dir, _small_index(tmp_path), **{"--max-len": 64})) == 1
    err = capsys.readouterr().err
    assert "warning: prompt 'q1' has" in err and "error: none of the 1 prompts fits --max-len 64" in err
    assert not (tmp_path / "r.jsonl").exists() and not (tmp_path / "r.jsonl.partial").exists()


def test_serve_validates_the_port_like_serve_search(capsys):
    for command in (["serve", "--model", "m"], ["serve-search", "--index", "i"]):
        with pytest.raises(SystemExit) as exc:
            cli_main.main([*command, "--port", "99999"])
        assert exc.value.code == 2 and "0..65535" in capsys.readouterr().err
