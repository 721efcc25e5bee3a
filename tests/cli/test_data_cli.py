"""`searchjax data ...`: inputs and outputs checked before work, one-line errors (status 1), no empty outputs."""

import json
import shutil

import pytest


def test_synth_qa_checks_index_and_out_first(small_world, tmp_path, fails):
    base = ["data", "synth-qa", "--world", small_world, "--n", "2", "--quiet"]
    fails("not a searchjax index", *base, "--index", tmp_path, "--out", tmp_path / "q.jsonl")
    fails("--index", *base, "--index", tmp_path / "nope", "--out", tmp_path / "q.jsonl")
    fails("is a directory, expected a file path", *base, "--out", tmp_path)
    fails("does not exist", *base, "--out", tmp_path / "no" / "q.jsonl")


def test_synth_qa_refuses_an_empty_world(small_world, tmp_path, fails):
    world = tmp_path / "w"
    shutil.copytree(small_world, world)
    (world / "kb.jsonl").write_text("")
    fails("kb.jsonl is empty", "data", "synth-qa", "--world", world, "--n", "2", "--out", tmp_path / "q.jsonl")
    assert not (tmp_path / "q.jsonl").exists()


def test_synth_qa_never_clobbers_and_overwrite_replaces(small_world, tmp_path, cli, fails):
    out = tmp_path / "q.jsonl"
    out.write_text("keep me\n")
    fails("exists (pass --overwrite", "data", "synth-qa", "--world", small_world, "--n", "2", "--out", out)
    assert out.read_text() == "keep me\n"
    code, _, err = cli("data", "synth-qa", "--world", small_world, "--n", "2", "--seed", "1", "--out", out,
                       "--overwrite")
    assert code == 0, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all("question" in r for r in rows)


@pytest.fixture
def qa_file(small_world, tmp_path, cli):
    out = tmp_path / "qa.jsonl"
    code, _, err = cli("data", "synth-qa", "--world", small_world, "--n", "2", "--seed", "1", "--out", out)
    assert code == 0, err
    return out


def test_sft_names_the_missing_fields_only(small_world, qa_file, tmp_path, fails):
    rows = [json.loads(line) for line in qa_file.read_text().splitlines()]
    del rows[1]["id"], rows[1]["chain"]
    qa_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    line = fails(f"{qa_file}:2: missing fields 'id', 'chain'", "data", "sft", "--world", small_world,
                 "--qa", qa_file, "--out", tmp_path / "sft.jsonl")
    assert "schema" not in line and "'question'" not in line


def test_sft_on_an_empty_qa_file_fails(small_world, tmp_path, fails, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    line = fails("no SFT example to write", "data", "sft", "--world", small_world, "--qa", empty,
                 "--out", tmp_path / "sft.jsonl", alone=False)
    assert not (tmp_path / "sft.jsonl").exists() and line


def test_sft_on_an_empty_qa_file_warns(small_world, tmp_path, cli):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, _, err = cli("data", "sft", "--world", small_world, "--qa", empty, "--abstention", "2",
                       "--out", tmp_path / "sft.jsonl")
    assert code == 0 and "warning: --qa" in err and "holds no QA record" in err


def test_missing_inputs_are_one_line(small_world, tmp_path, fails):
    fails("--qa", "data", "sft", "--world", small_world, "--qa", tmp_path / "none.jsonl", "--out", tmp_path / "o")
    fails("--in", "data", "calibrate", "--in", tmp_path / "none.jsonl", "--out", tmp_path / "o",
          "--policy-url", "http://127.0.0.1:9/v1")
    fails("--world", "data", "sft", "--world", tmp_path / "nope", "--qa", tmp_path / "none.jsonl",
          "--out", tmp_path / "o")


def test_public_help_lists_the_file_formats(cli):
    code, out, _ = cli("data", "public", "--help")
    assert code == 0
    for fmt, words in [("simpleqa", "CSV with columns metadata, problem, answer"), ("frames", "TSV"),
                       ("sealqa", "Parquet"), ("webwalkerqa", "Root_Url")]:
        assert fmt in out and words in out, fmt


def test_sigterm_leaves_the_previous_output_and_nothing_else(small_world, tmp_path):
    """`data synth-qa --overwrite` killed by SIGTERM mid-run: status 130, the old file intact, no temporary."""
    import os
    import signal
    import subprocess
    import sys

    world = tmp_path / "w"
    shutil.copytree(small_world, world, ignore=shutil.ignore_patterns("index"))
    out = tmp_path / "qa.jsonl"
    out.write_text("good\n" * 10)
    proc = subprocess.Popen([sys.executable, "-m", "searchjax.cli.main", "data", "synth-qa", "--world", str(world),
                             "--n", "5000", "--out", str(out), "--overwrite", "--quiet"],
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    try:
        assert "building the index" in proc.stderr.readline()  # the command is running (handlers installed)
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=300)[1]
    finally:
        proc.kill()
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    assert out.read_text() == "good\n" * 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qa.jsonl", "w"]
    # The index it was building is either whole (the signal came later) or absent: never half-written.
    assert {p.name for p in world.iterdir()} - {"index"} == {"corpus.jsonl", "kb.jsonl", "world.json"}
