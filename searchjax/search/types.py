"""The values every search backend speaks: results, errors, the backend protocol, and the shared tokenizer.

A backend is anything with `search(query: str, k: int = 10) -> list[SearchResult]` that raises only
`SearchError` for a failed search. The query tokenizer here mirrors tantivy's "default" text analyser
(split on every character that is not a letter or digit, lowercase, drop tokens longer than 40 bytes), so
the in-memory backend and the tantivy backend agree on what a term is.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from searchjax.data.jsonl import iter_jsonl

# Letters and digits of any script; "_" is a word character for `\w` but a separator for tantivy.
TOKEN_RE = re.compile(r"[^\W_]+")
_MAX_TOKEN_BYTES = 40  # tantivy's RemoveLongFilter limit in its default analyser
CORPUS_FIELDS = ("title", "url", "text")
STOP_WORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the to was were what when where "
    "which who whom whose why with".split()
)


class SearchError(Exception):
    """A search that could not be carried out (backend down, timeout, malformed response, bad index)."""


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """One hit: the document's title and url, and a snippet of its body around the matched terms."""

    title: str
    url: str
    snippet: str

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


class SearchBackend(Protocol):
    """What the search_web tool needs from an index."""

    def search(self, query: str, k: int = 10) -> list[SearchResult]: ...


def tokenize(text: str) -> list[str]:
    """Lowercased letter/digit runs of `text`, as tantivy's default analyser yields them (order kept)."""
    return [t for t in TOKEN_RE.findall(text.lower()) if len(t.encode("utf-8")) <= _MAX_TOKEN_BYTES]


def query_terms(query: str) -> list[str]:
    """Distinct terms of a query in first-occurrence order, stop words dropped: what a backend scores.

    Stop words carry almost no BM25 weight (their IDF is near 0) yet match most documents, so scoring them
    costs most of a query's time; they are kept only when the query has nothing else.
    """
    terms = list(dict.fromkeys(tokenize(query)))
    content = [t for t in terms if t not in STOP_WORDS]
    return content or terms


def check_k(k: int) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise SearchError(f"k must be a positive int, got {k!r}")
    return k


def check_corpus_row(row: dict) -> None:
    """Raise TypeError naming the field when `row` lacks a string title, url or text."""
    for field in CORPUS_FIELDS:
        if not isinstance(row.get(field), str):
            got = type(row[field]).__name__ if field in row else "nothing"
            raise TypeError(f"field {field!r} must be a string, got {got}")


def iter_corpus(path: str | Path) -> Iterator[dict]:
    """Yield the documents of a JSONL corpus, each a dict with string title, url and text.

    A bad line raises searchjax.data.jsonl.DataError (a ValueError) naming file:line and the field; blank
    lines are skipped. Extra fields (e.g. the world's "id") are passed through.
    """
    return iter_jsonl(path, validate=check_corpus_row)
