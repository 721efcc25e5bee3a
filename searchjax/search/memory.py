"""An in-memory search backend for tests: deterministic, dependency-free scoring over a list of documents."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from searchjax.search.snippets import idf, query_snippet
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
        weights = {t: idf(len(self.docs), sum(1 for counts in self._counts if counts[t])) for t in terms}
        return [
            SearchResult(self.docs[i]["title"], self.docs[i]["url"],
                         query_snippet(" ".join(self.docs[i]["text"].split()), weights, SNIPPET_CHARS))
            for _, _, i in scored[:k]
        ]
