"""`searchjax world build | index build | search`: checks before work, atomic outputs, notes, service URLs."""

import json

import pytest

from searchjax.search import MemoryBackend, SearchHTTPServer
from searchjax.search.http import serving_in_background

ROWS = [{"title": f"Doc {i}", "url": f"https://e.example/{i}", "text": f"river stone {i} lantern"} for i in range(5)]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_failed_index_build_can_be_retried(tmp_path, corpus, cli, fails):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n{oops\n")
    fails("bad.jsonl:2: invalid JSON", "index", "build", "--corpus", bad, "--out", tmp_path / "idx")
    assert not (tmp_path / "idx").exists() and not list(tmp_path.glob(".idx*"))
    code, out, err = cli("index", "build", "--corpus", corpus, "--out", tmp_path / "idx")
    assert code == 0 and "indexed 5 documents" in out, err


def test_index_build_never_clobbers_without_overwrite(tmp_path, corpus, cli, fails):
    assert cli("index", "build", "--corpus", corpus, "--out", tmp_path / "idx")[0] == 0
    fails("exists (pass --overwrite", "index", "build", "--corpus", corpus, "--out", tmp_path / "idx")
    assert cli("index", "build", "--corpus", corpus, "--out", tmp_path / "idx", "--overwrite")[0] == 0
    (tmp_path / "file").write_text("")
    fails("is a file, expected a directory", "index", "build", "--corpus", corpus, "--out", tmp_path / "file",
          "--overwrite")
    fails("--corpus", "index", "build", "--corpus", tmp_path / "none.jsonl", "--out", tmp_path / "i2")
    fails("does not exist", "index", "build", "--corpus", corpus, "--out", tmp_path / "no" / "idx")


def test_empty_corpus_fails(tmp_path, fails):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    fails("no documents", "index", "build", "--corpus", empty, "--out", tmp_path / "idx")
    assert not (tmp_path / "idx").exists()


def test_world_build_says_how_many_documents_and_why(tmp_path, cli, fails):
    code, out, err = cli("world", "build", "--out", tmp_path / "w", "--docs", 100, "--real-cities", 5)
    assert code == 0, err
    manifest = json.loads((tmp_path / "w" / "world.json").read_text())
    assert manifest["num_docs"] == manifest["num_docs_real"] + manifest["num_docs_fictional"] > 120
    assert f"{manifest['num_docs_real']:,} real-facts" in out
    assert "note:" in err and "--docs 100" in err and "--no-real" in err
    fails("exists (pass --overwrite", "world", "build", "--out", tmp_path / "w", "--docs", 100)
    assert cli("world", "build", "--out", tmp_path / "w", "--docs", 100, "--no-real", "--overwrite")[0] == 0
    assert json.loads((tmp_path / "w" / "world.json").read_text())["num_docs_real"] == 0


def test_search_says_when_the_query_was_cut(tmp_path, corpus, cli):
    assert cli("index", "build", "--corpus", corpus, "--out", tmp_path / "idx")[0] == 0
    long_query = "river " * 60
    code, out, err = cli("search", "--index", tmp_path / "idx", *long_query.split())
    assert code == 0 and "note: the query has 359 characters, more than 250" in err
    code, out, err = cli("search", "--index", tmp_path / "idx", "river")
    assert code == 0 and err == ""


def test_search_accepts_a_service_url(cli, fails):
    with serving_in_background(SearchHTTPServer(MemoryBackend(ROWS), port=0)) as server:
        code, out, err = cli("search", "--index", server.url, "--json", "lantern")
    assert code == 0, err
    assert {hit["url"] for hit in json.loads(out)} == {r["url"] for r in ROWS}


def test_search_errors_are_one_line(tmp_path, fails, monkeypatch):
    from searchjax.cli import common

    monkeypatch.setattr(common, "SERVICE_WAIT_S", 0.2)
    fails("--index", "search", "--index", tmp_path / "nope", "x")
    fails("not a searchjax index", "search", "--index", tmp_path, "x")
    fails("--index", "search", "--index", "http://127.0.0.1:9", "x")
    fails("http://HOST:PORT", "search", "--index", "ftp://x", "x")


def test_serve_search_rejects_a_bad_index_before_binding(tmp_path, fails):
    fails("--index", "serve-search", "--index", tmp_path / "nope", "--port", "0")
