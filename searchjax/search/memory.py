"""An in-memory search backend for tests: deterministic, dependency-free scoring over a list of documents."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from searchjax.search.types import (
    CORPUS_FIELDS,
    SearchError,
    SearchResult,
    check_corpus_row,
    check_k,
    query_terms,
    tokenize,
)

SNIPPET_CHARS = 200
_SNIPPET_LEAD = 60  # characters of context kept before the first matched term


def make_snippet(text: str, terms: Iterable[str], max_chars: int = SNIPPET_CHARS) -> str:
    """A window of `text` starting a little before the first occurrence of any of `terms`.

    Falls back to the head of the text when no term occurs. Whitespace is collapsed.
    """
    wanted = set(terms)
    lowered = text.lower()
    start = 0
    pos = 0
    for tok in tokenize(text):
        at = lowered.find(tok, pos)
        pos = at + len(tok)
        if tok in wanted:
            start = max(0, at - _SNIPPET_LEAD)
            break
    if start > 0:
        space = text.find(" ", start)
        start = space + 1 if 0 <= space < start + 20 else start
    return " ".join(text[start : start + max_chars].split())


class MemoryBackend:
    """Scores each document by (distinct query terms matched, total term frequency), ties by input order.

    Title and text both count. A query without any term returns no results.
    """

    def __init__(self, docs: Iterable[Mapping[str, str]]):
        self.docs: list[dict[str, str]] = []
        self._counts: list[Counter] = []
        for i, doc in enumerate(docs):
            try:
                check_corpus_row(dict(doc))
            except TypeError as e:
                raise ValueError(f"document {i}: {e}") from None
            self.docs.append({f: doc[f] for f in CORPUS_FIELDS})
            self._counts.append(Counter(tokenize(doc["title"] + " " + doc["text"])))

    def search(self, query: str, k: int = 10) -> list[SearchResult]:
        if not isinstance(query, str):
            raise SearchError(f"query must be a string, got {type(query).__name__}")
        k = check_k(k)
        terms = query_terms(query)
        scored = []
        for i, counts in enumerate(self._counts):
            matched = sum(1 for t in terms if counts[t])
            if matched:
                scored.append((-matched, -sum(counts[t] for t in terms), i))
        scored.sort()
        return [
            SearchResult(self.docs[i]["title"], self.docs[i]["url"], make_snippet(self.docs[i]["text"], terms))
            for _, _, i in scored[:k]
        ]
