"""Query-focused snippets of an index's documents, with the per-document work done once, at load.

`snippets.query_snippet` is the definition (and the reference this module is tested against): for every hit it
splits the text into sentences, lowercases it and compiles one regex of the query's stems, ~60-70% of a search's
time on the bench world. `SnippetIndex.snippet(row, query)` returns the same string,
`query_snippet(texts[row], weights, max_chars)`, for every text and weights, with less work per hit:

- the sentence spans (split_sentences) of every text longer than `max_chars` are found once, when the index is
  built, and kept in two flat arrays of starts and ends, 8 bytes a sentence (a text that fits is its own
  snippet and needs none): on the bench world's 100,030 documents, 305,675 sentences, 2.8 MB with the row
  offsets, split in 0.3-0.4 s;
- `SnippetIndex.query(weights)`, once per search, takes the query's stems and their weights (stem_weights);
- a stem is found in the lowercased text by `str.find` and kept where it is a whole token's stem: no token
  character (`[^\\W_]`, which is `str.isalnum`) just before it, nor just after it when it is shorter than
  STEM_CHARS. These are matched_stems' matches with no regex to compile; each sentence's set of stems is filled
  in text order, as there, so the sets, and the float sums of their weights, are the same;
- only the matched sentences are ranked by score; the others follow in document order (all score 0), and the
  greedy fill adds sentences in that order as query_snippet does, passing over at once a sentence longer than
  the room left plus one GAP (adding a sentence costs at least its length less one GAP).

That ranking needs every matched sentence to score above 0, as IDF weights (positive) make it; where one scores
0 (weights of 0, below 0 or NaN, which stem_weights makes 0.0), the snippet is query_snippet's own.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from searchjax.search.snippets import (
    GAP,
    LEAD_CHARS,
    STEM_CHARS,
    lowercase,
    query_snippet,
    sentence_score,
    split_sentences,
    stem_weights,
    word_window,
)
from searchjax.search.types import TOKEN_RE


class SnippetQuery(NamedTuple):
    """A query as the snippets see it: its term weights, its stems' weights, and the stems a token can have."""

    weights: Mapping[str, float]
    wanted: dict[str, float]
    stems: tuple[str, ...]


class SnippetIndex:
    """The sentence spans of `texts` (whitespace-collapsed, as query_snippet expects), for snippets of at most
    `max_chars` characters. `texts` is kept, not copied."""

    def __init__(self, texts: Sequence[str], max_chars: int):
        if max_chars < 1:
            raise ValueError(f"max_chars must be positive, got {max_chars}")
        self.texts, self.max_chars = texts, max_chars
        self._starts, self._ends, self._offsets = array("I"), array("I"), array("I", [0])
        for text in texts:
            if len(text) > max_chars:
                spans = split_sentences(text)
                self._starts.extend(a for a, _ in spans)
                self._ends.extend(b for _, b in spans)
            self._offsets.append(len(self._starts))

    @staticmethod
    def query(weights: Mapping[str, float]) -> SnippetQuery:
        wanted = stem_weights(weights)
        return SnippetQuery(weights, wanted, tuple(s for s in wanted if TOKEN_RE.fullmatch(s)))

    def snippet(self, row: int, query: SnippetQuery) -> str:
        """query_snippet(self.texts[row], query.weights, self.max_chars)."""
        text, max_chars = self.texts[row], self.max_chars
        if len(text) <= max_chars:
            return text
        hits = _stem_hits(lowercase(text), query.stems)
        if not hits:
            return word_window(text, 0, max_chars)
        lo, hi = self._offsets[row], self._offsets[row + 1]
        starts = self._starts[lo:hi]
        seen: dict[int, set[str]] = {}
        first: dict[int, int] = {}
        for at, s in hits:  # in text order, as matched_stems adds them
            i = bisect.bisect_right(starts, at) - 1
            if i in seen:
                seen[i].add(s)
            else:
                seen[i], first[i] = set(), at
                seen[i].add(s)
        scores = {i: sentence_score(found, query.wanted) for i, found in seen.items()}
        if not all(score > 0 for score in scores.values()):
            return query_snippet(text, query.weights, max_chars)
        order = sorted(scores, key=lambda i: (-scores[i], i))
        best = order[0]
        ends = self._ends[lo:hi]
        if ends[best] - starts[best] > max_chars:
            return word_window(text, max(starts[best], first[best] - LEAD_CHARS), max_chars)
        order += [i for i in range(hi - lo) if i not in scores]
        return _fill(text, starts, ends, order, max_chars)


def _stem_hits(low: str, stems: tuple[str, ...]) -> list[tuple[int, str]]:
    """(position, stem) of each token of `low` whose stem is one of `stems`, in text order."""
    hits = []
    n = len(low)
    for s in stems:
        k = len(s)
        at = low.find(s)
        while at >= 0:
            if (at == 0 or not low[at - 1].isalnum()) and (k >= STEM_CHARS or at + k == n or not low[at + k].isalnum()):
                hits.append((at, s))
            at = low.find(s, at + 1)
    hits.sort()  # one stem at most per position: a token has one stem
    return hits


def _fill(text: str, starts: array, ends: array, order: list[int], max_chars: int) -> str:
    """query_snippet's greedy fill: sentences taken in `order` while the snippet stays within `max_chars`,
    shown in document order, neighbours joined by their own separator and the others by GAP."""
    chosen: list[int] = []
    length = 0
    for i in order:
        if ends[i] - starts[i] - len(GAP) > max_chars - length:
            continue  # too long to fit: adding a sentence costs its length less at most one GAP
        at = bisect.bisect_left(chosen, i)
        grown = length + ends[i] - starts[i]
        if at:
            before = chosen[at - 1]
            grown += starts[i] - ends[before] if before == i - 1 else len(GAP)
        if at < len(chosen):
            after = chosen[at]
            grown += starts[after] - ends[i] if after == i + 1 else len(GAP)
            if at:
                grown -= len(GAP)  # `before` and `after`, both chosen and not neighbours, were joined by GAP
        if grown <= max_chars:
            chosen.insert(at, i)
            length = grown
    pieces = [text[starts[chosen[0]]:ends[chosen[0]]]]
    for before, i in zip(chosen, chosen[1:]):
        pieces.append(text[ends[before]:starts[i]] if i == before + 1 else GAP)
        pieces.append(text[starts[i]:ends[i]])
    return "".join(pieces)
