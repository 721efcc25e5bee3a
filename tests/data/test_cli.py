"""`searchjax data ...` commands end to end on the session world (progress bar off, summaries on stderr)."""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from searchjax.cli import data as data_cli
from searchjax.data.jsonl import read_jsonl
from searchjax.data.synth import validate_qa_record

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "public"


def run(argv):
    parser = argparse.ArgumentParser(prog="searchjax")
    data_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_synth_qa_then_sft(world, tmp_path, capsys):
    out = tmp_path / "qa.jsonl"
    assert run(["data", "synth-qa", "--world", str(world), "--index", str(world / "index"), "--n", "12",
                "--out", str(out), "--seed", "4", "--hops", "2-3", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().err)
    rows, _ = read_jsonl(out, validate=validate_qa_record)
    assert summary["kept"] == 12 and summary["written"] == len(rows)
    assert {r["hops"] for r in rows if not r["augmented"]} == {2, 3}
    assert any(k.startswith("rejected:") for k in summary)

    sft = tmp_path / "sft.jsonl"
    assert run(["data", "sft", "--world", str(world), "--index", str(world / "index"), "--qa", str(out),
                "--out", str(sft), "--abstention", "2"]) == 0
    summary = json.loads(capsys.readouterr().err)
    assert summary["written"] == len(read_jsonl(sft)[0]) and summary["kept:abstention"] == 2


def test_rubric_and_public(tmp_path, capsys):
    assert run(["data", "rubric", "--n", "7", "--out", str(tmp_path / "r.jsonl")]) == 0
    assert len(read_jsonl(tmp_path / "r.jsonl")[0]) == 7
    capsys.readouterr()
    assert run(["data", "public", "--format", "frames", "--in", str(FIX / "frames_test.tsv"),
                "--out", str(tmp_path / "f.jsonl")]) == 0
    assert json.loads(capsys.readouterr().err)["kept"] == 2
    assert run(["data", "public", "--format", "bamboogle", "--in", str(tmp_path / "missing.csv"),
                "--out", str(tmp_path / "o.jsonl")]) == 1
    assert "missing.csv: no such file" in capsys.readouterr().err


class _Policy(BaseHTTPRequestHandler):
    """A policy endpoint: the reference answer on every other request for a prompt, the prompt itself otherwise."""

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        n = self.server.counts[prompt] = self.server.counts.get(prompt, 0) + 1
        content = self.server.references[prompt] if n % 2 else prompt
        out = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def test_calibrate_against_a_policy_endpoint(tmp_path, capsys):
    assert run(["data", "rubric", "--n", "6", "--out", str(tmp_path / "r.jsonl")]) == 0
    records, _ = read_jsonl(tmp_path / "r.jsonl")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Policy)
    server.counts, server.references = {}, {r["messages"][-1]["content"]: r["reference"] for r in records}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        capsys.readouterr()
        assert run(["data", "calibrate", "--in", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "c.jsonl"),
                    "--policy-url", f"http://127.0.0.1:{server.server_address[1]}/v1"]) == 0
    finally:
        server.shutdown()
        server.server_close()
    report = json.loads(capsys.readouterr().err)
    assert report["n"] == 6 and report["kept"] == len(read_jsonl(tmp_path / "c.jsonl")[0])
    assert report["kept_fraction"] == pytest.approx(report["kept"] / 6) and report["kept"] >= 4


@pytest.mark.parametrize("argv, message", [
    (["--hops", "5-2"], "2 <= low <= high"),
    (["--hops", "1-9"], "2 <= low <= high"),
    (["--n", "-3"], "integer >= 1"),
    (["--n", "many"], "expected an integer"),
])
def test_synth_qa_bad_flags_are_usage_errors(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        run(["data", "synth-qa", "--world", str(tmp_path), "--out", str(tmp_path / "q.jsonl"), *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_bad_config_and_world_are_clear_errors(world, tmp_path, capsys):
    base = ["data", "synth-qa", "--out", str(tmp_path / "q.jsonl"), "--quiet", "--overwrite"]
    assert run([*base, "--world", str(tmp_path / "nope")]) == 1
    assert "nope: no such directory" in capsys.readouterr().err
    assert run([*base, "--world", str(world), "--config", str(tmp_path / "missing.yaml")]) == 1
    assert "missing.yaml: no such config file" in capsys.readouterr().err
    cfg = tmp_path / "synth.yaml"
    cfg.write_text("min_hops: 3\nmax_hops: 3\n")
    assert run([*base, "--world", str(world), "--config", str(cfg), "--hops", "2", "--n", "2"]) == 0  # flags win
    cfg.write_text("min_hops: 4\nmax_hops: 2\n")
    assert run([*base, "--world", str(world), "--config", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert f"{cfg}: " in err and "need 2 <= min_hops <= max_hops" in err


def test_sft_reports_skipped_rows(world, tmp_path, capsys):
    qa = tmp_path / "qa.jsonl"
    assert run(["data", "synth-qa", "--world", str(world), "--index", str(world / "index"), "--n", "3",
                "--out", str(qa), "--seed", "5", "--hops", "2", "--quiet"]) == 0
    qa.write_text(qa.read_text() + "not json\n" + json.dumps({"id": "x"}) + "\n")
    capsys.readouterr()
    argv = ["data", "sft", "--world", str(world), "--index", str(world / "index"), "--qa", str(qa),
            "--out", str(tmp_path / "sft.jsonl")]
    assert run(argv) == 1
    assert f"{qa}:" in capsys.readouterr().err  # stops at file:line by default
    assert run([*argv, "--on-error", "skip"]) == 0
    read = json.loads(capsys.readouterr().err)["read_qa"]
    assert read["skipped"] == 2 and read["kept"] >= 3
    assert read["reasons"][0].startswith(f"{qa}:") and "invalid JSON" in read["reasons"][0]


def test_calibrate_unreachable_endpoint_and_bad_k(tmp_path, capsys):
    assert run(["data", "rubric", "--n", "2", "--out", str(tmp_path / "r.jsonl")]) == 0
    base = ["data", "calibrate", "--in", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "c.jsonl")]
    capsys.readouterr()
    assert run([*base, "--policy-url", "http://127.0.0.1:9/v1"]) == 1  # port 9 (discard): nothing listens
    assert "no response after" in capsys.readouterr().err
    assert run([*base, "--policy-url", "localhost:8000"]) == 1
    assert "must start with http://" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run([*base, "--policy-url", "http://127.0.0.1:9/v1", "--k", "1"])
    assert "integer >= 2" in capsys.readouterr().err
