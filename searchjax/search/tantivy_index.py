"""The embedded default backend: a tantivy index on disk built from a JSONL corpus (title, url, text).

Ranking is tantivy's BM25 over the body field `text`; snippets come from tantivy's SnippetGenerator on the
same field. Queries are never handed to tantivy's query parser: the query is tokenized exactly as the body
was (types.tokenize) and becomes a disjunction of term queries, so query-syntax characters (`:`, `"`, `(`,
`^`, `~`, `*`, `AND`, ...) are ordinary text and can never raise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import tantivy
from tqdm import tqdm

from searchjax.search.types import SearchError, SearchResult, check_k, iter_corpus, query_terms

SNIPPET_MAX_CHARS = 200
_META_FILE = "searchjax_index.json"
# One indexing thread keeps document order, hence tie-breaking between equal BM25 scores, deterministic.
_WRITER_THREADS = 1
_WRITER_HEAP = 256_000_000


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("title", stored=True)
    builder.add_text_field("url", stored=True, tokenizer_name="raw")
    builder.add_text_field("text", stored=True, index_option="position")
    return builder.build()


def build_index(corpus_jsonl: str | Path, out_dir: str | Path, progress: bool = True) -> int:
    """Index every document of `corpus_jsonl` into a fresh tantivy index at `out_dir`; returns the count.

    An existing `out_dir` is replaced only when it holds a searchjax index (never an unrelated folder).
    """
    out_dir = Path(out_dir)
    if out_dir.exists():
        if not (out_dir / _META_FILE).exists():
            raise FileExistsError(f"{out_dir} exists and is not a searchjax index; refusing to overwrite it")
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    index = tantivy.Index(_schema(), path=str(out_dir))
    writer = index.writer(heap_size=_WRITER_HEAP, num_threads=_WRITER_THREADS)
    n = 0
    for doc in tqdm(iter_corpus(corpus_jsonl), desc="index", unit="doc", disable=not progress):
        writer.add_document(tantivy.Document(title=doc["title"], url=doc["url"], text=doc["text"]))
        n += 1
    writer.commit()
    writer.wait_merging_threads()
    (out_dir / _META_FILE).write_text(json.dumps({"corpus": str(corpus_jsonl), "num_docs": n}) + "\n")
    return n


class TantivyBackend:
    """BM25 search over a tantivy index written by `build_index`."""

    def __init__(self, index_dir: str | Path):
        index_dir = Path(index_dir)
        if not (index_dir / _META_FILE).exists():
            raise SearchError(f"{index_dir} is not a searchjax index (no {_META_FILE}); run `searchjax index build`")
        self.index_dir = index_dir
        self._index = tantivy.Index.open(str(index_dir))
        self._schema = self._index.schema
        self._searcher = self._index.searcher()

    @property
    def num_docs(self) -> int:
        return self._searcher.num_docs

    def search(self, query: str, k: int = 10) -> list[SearchResult]:
        if not isinstance(query, str):
            raise SearchError(f"query must be a string, got {type(query).__name__}")
        k = check_k(k)
        terms = query_terms(query)
        if not terms:
            return []
        q = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(self._schema, "text", t)) for t in terms]
        )
        try:
            hits = self._searcher.search(q, limit=k, count=False).hits  # counting would score every match
            snippets = tantivy.SnippetGenerator.create(self._searcher, q, self._schema, "text")
            snippets.set_max_num_chars(SNIPPET_MAX_CHARS)
            out = []
            for _score, address in hits:
                doc = self._searcher.doc(address)
                fragment = snippets.snippet_from_doc(doc).fragment()
                text = fragment if fragment.strip() else doc.get_first("text")[:SNIPPET_MAX_CHARS]
                out.append(SearchResult(doc.get_first("title"), doc.get_first("url"), " ".join(text.split())))
        except (ValueError, OSError, RuntimeError) as e:
            raise SearchError(f"tantivy search failed: {e}") from e
        return out
