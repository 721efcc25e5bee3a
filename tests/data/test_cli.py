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
                "--out", str(tmp_path / "o.jsonl")]) == 2
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
