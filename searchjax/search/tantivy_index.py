"""The embedded default backend: a tantivy index on disk built from a JSONL corpus (title, url, text).

Ranking is tantivy's BM25 over the body field `text`; snippets are the body's sentences that hold the query's
terms, weighted by the index's IDF (searchjax.search.snippets; the rows' sentences are split once, at load, by
searchjax.search.snippet_index: ~8 bytes a sentence of the rows longer than a snippet). The index directory
holds the tantivy index (the body indexed with positions, not stored, and a fast field `row`) and
DIR/docs.jsonl, the documents' [title, url, text] by row, which the backend keeps in memory: reading 10
documents from tantivy's compressed store cost twice the search itself, so the backend's memory grows with the
corpus (about 1.5x the corpus text); larger corpora are served by one `serve-search` process. Queries are never
handed to tantivy's query parser: the query is tokenized exactly as the body was (types.tokenize) and becomes a
disjunction of term queries, so query-syntax characters (`:`, `"`, `(`, `^`, `~`, `*`, `AND`, ...) are
ordinary text and can never raise.
"""

from __future__ import annotations

import json
from pathlib import Path

import tantivy
from tqdm import tqdm

from searchjax.atomic import atomic_path, replaceable_dir
from searchjax.search.snippet_index import SnippetIndex
from searchjax.search.snippets import idf, query_snippet
from searchjax.search.types import SearchError, SearchResult, check_k, iter_corpus, query_terms

SNIPPET_MAX_CHARS = 200
_META_FILE = "searchjax_index.json"
_DOCS_FILE = "docs.jsonl"
# One indexing thread keeps document order, hence tie-breaking between equal BM25 scores, deterministic.
_WRITER_THREADS = 1
_WRITER_HEAP = 256_000_000


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("text", stored=False, index_option="position")
    builder.add_unsigned_field("row", fast=True)
    return builder.build()


def build_index(corpus_jsonl: str | Path, out_dir: str | Path, progress: bool = True) -> int:
    """Index every document of `corpus_jsonl` into a fresh tantivy index at `out_dir`; returns the count.

    The index is built in a temporary sibling and renamed to `out_dir` at the end, so a failed build (a bad
    corpus line, an empty corpus, a kill) leaves `out_dir` as it was and nothing beside it. An existing
    `out_dir` is replaced only when it holds a searchjax index or is empty (never an unrelated folder). An
    empty corpus is an error: its index could answer no query.
    """
    out_dir = Path(out_dir)
    if not replaceable_dir(out_dir, _META_FILE):
        raise FileExistsError(f"{out_dir} exists and is not a searchjax index; refusing to overwrite it")
    if not out_dir.parent.is_dir():
        out_dir.parent.mkdir(parents=True)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        n = _write_index(corpus_jsonl, tmp, progress)
        if n == 0:
            raise ValueError(f"{corpus_jsonl}: no documents; an empty index could answer no query")
        (tmp / _META_FILE).write_text(json.dumps({"corpus": str(corpus_jsonl), "num_docs": n}) + "\n")
    return n


def _write_index(corpus_jsonl: str | Path, out_dir: Path, progress: bool) -> int:
    index = tantivy.Index(_schema(), path=str(out_dir))
    writer = index.writer(heap_size=_WRITER_HEAP, num_threads=_WRITER_THREADS)
    n = 0
    try:
        with (out_dir / _DOCS_FILE).open("w", encoding="utf-8") as rows:
            for doc in tqdm(iter_corpus(corpus_jsonl), desc="index", unit="doc", disable=not progress):
                entry = tantivy.Document(text=doc["text"])
                entry.add_unsigned("row", n)
                writer.add_document(entry)
                rows.write(json.dumps([doc["title"], doc["url"], doc["text"]], ensure_ascii=False) + "\n")
                n += 1
    except BaseException:
        # Stop tantivy's indexing threads before the caller removes the folder they write into.
        writer.rollback()
        writer.wait_merging_threads()
        raise
    writer.commit()
    writer.wait_merging_threads()
    return n


def bm25_query(schema: tantivy.Schema, terms: list[str]) -> tantivy.Query:
    """The disjunction of the body's term queries: BM25 sums the matched terms' scores."""
    return tantivy.Query.boolean_query([(tantivy.Occur.Should, tantivy.Query.term_query(schema, "text", t))
                                        for t in terms])


def _load_rows(path: Path) -> list[tuple[str, str, str]]:
    """The [title, url, text] rows beside the index, text whitespace-collapsed; SearchError names file:line.

    Whitespace is collapsed once here rather than in every snippet: a fragment of collapsed text is
    collapsed, and the snippet window then counts the characters the reader sees.
    """
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            try:
                title, url, text = json.loads(line)
                rows.append((title, url, " ".join(text.split())))
            except (ValueError, TypeError, AttributeError) as e:
                raise SearchError(f"{path}:{lineno}: not a [title, url, text] row ({e}); rebuild the index") from None
    return rows


class TantivyBackend:
    """BM25 search over a tantivy index written by `build_index`."""

    def __init__(self, index_dir: str | Path):
        index_dir = Path(index_dir)
        for required in (_META_FILE, _DOCS_FILE):
            if not (index_dir / required).exists():
                raise SearchError(f"{index_dir} is not a searchjax index (no {required}); run `searchjax index build`")
        self.index_dir = index_dir
        self._index = tantivy.Index.open(str(index_dir))
        self._schema = self._index.schema
        self._searcher = self._index.searcher()
        self._rows = _load_rows(index_dir / _DOCS_FILE)
        if len(self._rows) != self._searcher.num_docs:
            raise SearchError(f"{index_dir}: {_DOCS_FILE} has {len(self._rows)} rows for "
                              f"{self._searcher.num_docs} indexed documents; rebuild the index")
        self._snippets = SnippetIndex([text for _title, _url, text in self._rows], SNIPPET_MAX_CHARS)

    @property
    def num_docs(self) -> int:
        return self._searcher.num_docs

    def search(self, query: str, k: int = 10) -> list[SearchResult]:
        rows, weights = self._hits(query, k)
        snippet_query = self._snippets.query(weights)  # once per search: its stems and their weights
        return [SearchResult(*self._rows[row][:2], self._snippets.snippet(row, snippet_query)) for row in rows]

    def reference_search(self, query: str, k: int = 10) -> list[SearchResult]:
        """search() with every snippet from the definition, snippets.query_snippet, instead of the SnippetIndex:
        the two must be equal (tests/search/test_snippet_index.py, tools/bench_search.py)."""
        rows, weights = self._hits(query, k)
        return [SearchResult(*self._rows[row][:2], query_snippet(self._rows[row][2], weights, SNIPPET_MAX_CHARS))
                for row in rows]

    def _hits(self, query: str, k: int) -> tuple[list[int], dict[str, float]]:
        """The rows of the top `k` documents, best first, and the IDF weights of the query's terms."""
        if not isinstance(query, str):
            raise SearchError(f"query must be a string, got {type(query).__name__}")
        k = check_k(k)
        terms = query_terms(query)
        if not terms:
            return [], {}
        q = bm25_query(self._schema, terms)
        try:
            hits = self._searcher.search(q, limit=k, count=False).hits  # counting would score every match
            rows = self._searcher.fast_field_values("row", [address for _score, address in hits])
            weights = {t: idf(self.num_docs, self._searcher.doc_freq("text", t)) for t in terms} if rows else {}
        except (ValueError, OSError, RuntimeError) as e:
            raise SearchError(f"tantivy search failed: {e}") from e
        return rows, weights
