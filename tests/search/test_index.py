"""The tantivy and in-memory backends: index build on the world corpus, ranking, never-raising queries."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.search import MemoryBackend, SearchError, SearchResult, SearchTool, TantivyBackend, build_index
from searchjax.search.tantivy_index import SNIPPET_MAX_CHARS

SYNTAX = ['title:"unclosed', "a AND OR NOT", "(((", ")", "^2", "~3", "*", "?", "+-!", "[1 TO 5]", "{a TO b}",
          "\\", "/regex/", "a:b:c", "\"\"", "field:", "NOT", "&&||", "\x00", "😀 emoji", "ñandú Ünïcode",
          "   ", "x" * 80, "a_b_c", "IN [x y]"]


def test_index_holds_the_world_corpus(world_dir, tantivy_backend):
    n = sum(1 for _ in open(world_dir / "corpus.jsonl"))
    assert tantivy_backend.num_docs == n > 1000


def test_entity_page_is_found_by_name(kb, tantivy_backend):
    for entity in kb.by_type("company")[:10] + kb.by_type("country")[:10]:
        urls = [r.url for r in tantivy_backend.search(entity.name, 10)]
        own = {kb.document(d)["url"] for d in entity.doc_ids}
        assert own & set(urls), (entity.name, urls)


def test_results_are_well_formed_and_bounded(tantivy_backend):
    results = tantivy_backend.search("born in the capital", 7)
    assert 0 < len(results) <= 7
    for r in results:
        assert isinstance(r, SearchResult) and r.title and r.url.startswith("https://")
        assert 0 < len(r.snippet) <= SNIPPET_MAX_CHARS + 20
    assert tantivy_backend.search("", 10) == [] and tantivy_backend.search("!!! ???", 10) == []
    with pytest.raises(SearchError):
        tantivy_backend.search("x", 0)


def test_search_is_deterministic(tantivy_backend, index_dir):
    again = TantivyBackend(index_dir)
    for q in ("river festival", "novel published 1990", "capital"):
        assert tantivy_backend.search(q) == again.search(q)


@pytest.mark.parametrize("query", SYNTAX)
def test_query_syntax_characters_never_raise(tantivy_backend, query):
    assert isinstance(tantivy_backend.search(query), list)
    assert isinstance(tantivy_backend.search(f"France {query} capital"), list)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_random_queries_never_raise(tantivy_backend, query):
    results = tantivy_backend.search(query, 10)
    assert len(results) <= 10
    outcome = SearchTool(tantivy_backend).call({"query": query})
    assert outcome.ok == bool(query.strip())


def test_build_index_checks_its_input(tmp_path):
    bad = tmp_path / "bad.jsonl"
    rows = [{"title": "t", "url": "u", "text": "ok"}, {"title": "t", "url": 3}]
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"bad.jsonl:2: field 'url' must be a string"):
        build_index(bad, tmp_path / "idx", progress=False)
    (tmp_path / "notanindex").mkdir()
    (tmp_path / "notanindex" / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        build_index(bad, tmp_path / "notanindex", progress=False)
    with pytest.raises(SearchError, match="not a searchjax index"):
        TantivyBackend(tmp_path / "notanindex")


def test_failed_build_leaves_nothing_and_can_be_retried(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"title": "t", "url": "u", "text": "ok"}) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"c.jsonl:2"):
        build_index(corpus, tmp_path / "idx", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]
    corpus.write_text(json.dumps({"title": "t", "url": "u", "text": "ok"}) + "\n")
    assert build_index(corpus, tmp_path / "idx", progress=False) == 1
    # A failed rebuild keeps the previous index, searchable.
    corpus.write_text("{not json\n")
    with pytest.raises(ValueError):
        build_index(corpus, tmp_path / "idx", progress=False)
    assert TantivyBackend(tmp_path / "idx").search("ok")[0].url == "u"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "idx"]


def test_empty_corpus_is_an_error(tmp_path):
    corpus = tmp_path / "empty.jsonl"
    corpus.write_text("\n")
    with pytest.raises(ValueError, match="empty.jsonl: no documents"):
        build_index(corpus, tmp_path / "idx", progress=False)
    assert not (tmp_path / "idx").exists()


def test_rebuild_replaces_an_index(tmp_path):
    corpus = tmp_path / "c.jsonl"
    rows = [{"title": f"T{i}", "url": f"u{i}", "text": f"w{i} common"} for i in range(5)]
    corpus.write_text("\n".join(json.dumps(r) for r in rows))
    assert build_index(corpus, tmp_path / "idx", progress=False) == 5
    assert build_index(corpus, tmp_path / "idx", progress=False) == 5
    assert TantivyBackend(tmp_path / "idx").num_docs == 5


def test_snippets_collapse_whitespace_and_window_long_texts(tmp_path):
    corpus = tmp_path / "c.jsonl"
    long_text = " ".join(f"filler{i}" for i in range(100)) + "  the\tneedle\n\nsits   here " + "tail " * 60
    rows = [{"title": "Short", "url": "u0", "text": "alpha\n\n  beta\tgamma  "},
            {"title": "Long", "url": "u1", "text": long_text}]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    build_index(corpus, tmp_path / "idx", progress=False)
    backend = TantivyBackend(tmp_path / "idx")
    assert backend.search("gamma") == [SearchResult("Short", "u0", "alpha beta gamma")]
    (hit,) = backend.search("needle")
    assert "the needle sits here" in hit.snippet and len(hit.snippet) <= SNIPPET_MAX_CHARS
    assert "  " not in hit.snippet and "\n" not in hit.snippet and "filler0 " not in hit.snippet


def test_memory_backend_scoring_and_snippets():
    docs = [{"title": "Alpha", "url": "u0", "text": "apples and pears"},
            {"title": "Beta", "url": "u1", "text": "pears only " + "filler " * 60 + "apples at the end"},
            {"title": "Gamma", "url": "u2", "text": "nothing relevant"}]
    backend = MemoryBackend(docs)
    assert [r.url for r in backend.search("pears apples")] == ["u0", "u1"]
    assert [r.url for r in backend.search("pears")] == ["u0", "u1"]
    assert backend.search("zebra") == [] and backend.search(":(") == []
    assert backend.search("end")[0].snippet.endswith("apples at the end")
    with pytest.raises(ValueError, match="document 0: field 'text'"):
        MemoryBackend([{"title": "t", "url": "u"}])


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=100))
def test_memory_backend_never_raises(query):
    docs = [{"title": "Alpha", "url": "u0", "text": "apples and pears ñandú 😀"}]
    assert len(MemoryBackend(docs).search(query, 3)) <= 1


def test_stop_words_are_dropped_unless_nothing_else_is_left():
    from searchjax.search.types import query_terms

    assert query_terms("The birthplace of Ludev Zaereitan, the poet") == ["birthplace", "ludev", "zaereitan", "poet"]
    assert query_terms("who was the") == ["who", "was", "the"]
    docs = [{"title": "A", "url": "u0", "text": "the of the of"}, {"title": "B", "url": "u1", "text": "poet"}]
    assert [r.url for r in MemoryBackend(docs).search("the poet")] == ["u1"]
    assert [r.url for r in MemoryBackend(docs).search("of the")] == ["u0"]


def test_bm25_ranks_the_rare_name_above_the_common_relation_word(kb, tantivy_backend):
    for entity in kb.by_type("person")[:20]:
        query = f"the birthplace of {entity.name}"
        own = {kb.document(d)["url"] for d in entity.doc_ids}
        assert tantivy_backend.search(query)[0].url in own, query


def test_index_with_missing_rows_is_refused(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps({"title": f"T{i}", "url": f"u{i}", "text": f"w{i}"}) for i in range(3)))
    build_index(corpus, tmp_path / "idx", progress=False)
    rows = (tmp_path / "idx" / "docs.jsonl").read_text().splitlines()
    (tmp_path / "idx" / "docs.jsonl").write_text("\n".join(rows[:2]) + "\n")
    with pytest.raises(SearchError, match="2 rows for 3 indexed documents"):
        TantivyBackend(tmp_path / "idx")
    for bad in ("{not json", '["T2", "u2"]', '["T2", "u2", 5]'):  # truncated, short or mistyped row
        (tmp_path / "idx" / "docs.jsonl").write_text("\n".join(rows[:2] + [bad]) + "\n")
        with pytest.raises(SearchError, match=r"docs.jsonl:3: not a \[title, url, text\] row"):
            TantivyBackend(tmp_path / "idx")
