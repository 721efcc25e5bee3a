"""Query-focused snippets: the sentences of a document that hold the query's terms, never cut mid-sentence.

A snippet is what the policy reads of a hit, so it should show the sentence that answers the query. A fixed
window (or tantivy's fragment generator, which scores windows of characters) often shows the document's
opening and stops inside the sentence that matters: "... The organiser of Kraegydraeth Quiet Games was" with
the name cut off. Here the text is split into sentences and each is scored by the query terms it contains:

    score(s) = Σ_{t ∈ terms, stem(t) ∈ stems(s)} w_t,      stem(w) = w[:STEM_CHARS]

with w_t the backend's inverse document frequency of the term, ln(1 + N / (1 + df_t)), so a rare term (a name,
a number) counts more than a common one. Truncation stemming lets "founder" meet "founded" and "organiser" meet
"organised". Sentences are taken best first (ties: the earlier one) while the snippet stays within
`max_chars`, and shown in document order, " ... " between sentences that are not neighbours in the text. A best
sentence longer than `max_chars` is shown as a word-aligned window starting a little before its first matched
term; a text with no matching sentence shows its opening, word-aligned.

query_snippet is the definition; searchjax.search.snippet_index.SnippetIndex returns the same snippets for an
index's documents with the per-document work (the sentence split) done once, at load.
"""

from __future__ import annotations

import bisect
import functools
import math
import re
from collections.abc import Iterable, Mapping

from searchjax.search.types import TOKEN_RE

STEM_CHARS = 6
GAP = " ... "
LEAD_CHARS = 60  # context kept before the first matched term when one sentence alone is too long
# A sentence ends at . ! ? or an ideographic full stop, followed by whitespace (or, after "。", by anything): the
# match is the stop and the whitespace after it. (No lookbehind: sre then scans for the stop characters fast,
# where a leading lookbehind is tried at every position, ten times slower.)
_SENTENCE_END = re.compile(r"[.!?]\s+|。\s*")


def stem(term: str) -> str:
    return term[:STEM_CHARS]


def idf(num_docs: int, doc_freq: int) -> float:
    """ln(1 + N / (1 + df)): the weight of a term found in `doc_freq` of `num_docs` documents."""
    return math.log1p(num_docs / (1 + doc_freq))


def stem_weights(weights: Mapping[str, float]) -> dict[str, float]:
    """The weight of each stem of the query's terms: the largest among its terms' weights (at least 0.0)."""
    wanted: dict[str, float] = {}
    for term, w in weights.items():
        wanted[stem(term)] = max(wanted.get(stem(term), 0.0), w)
    return wanted


def sentence_score(found: Iterable[str], wanted: Mapping[str, float]) -> float:
    """The summed weight of the query stems a sentence holds, exactly rounded (math.fsum): with sum() over a set,
    the order (hash-seeded, so per process) moved the last bit, and two sentences holding the same stems tied in one
    process and not in the next, so the same query on the same index showed different snippets."""
    return math.fsum(wanted[x] for x in found)


def lowercase(text: str) -> str:
    """text.lower(), position for position: where a letter's lowercase is longer ("İ"), its first character."""
    low = text.lower()
    if len(low) != len(text):
        low = "".join(c.lower()[0] for c in text)
    return low


def split_sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the sentences of whitespace-collapsed `text`, in order."""
    spans, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        spans.append((start, m.start() + 1))  # the sentence keeps its stop (one character)
        start = m.end()
    if start < len(text):
        spans.append((start, len(text)))
    return spans


def word_window(text: str, start: int, max_chars: int) -> str:
    """At most `max_chars` of `text` from `start`, moved forward to a word start and cut at a word end."""
    if start > 0 and not text[start - 1].isspace():
        space = text.find(" ", start)
        start = space + 1 if 0 <= space < start + 20 else start
    window = text[start:start + max_chars]
    if start + max_chars < len(text) and not text[start + max_chars].isspace() and " " in window:
        window = window[:window.rindex(" ")]
    return window.strip()


def query_snippet(text: str, weights: Mapping[str, float], max_chars: int) -> str:
    """The snippet of `text` for a query whose terms have the IDF `weights` (module docstring).

    `text` is whitespace-collapsed; the result has at most `max_chars` characters. A text that fits whole is
    its own snippet (every sentence chosen, all neighbours).
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    if len(text) <= max_chars:
        return text
    wanted = stem_weights(weights)
    spans = split_sentences(text)
    if not spans:
        return ""
    low = lowercase(text)
    seen, first = matched_stems(low, spans, wanted)
    scores = [sentence_score(found, wanted) for found in seen]
    best = max(range(len(spans)), key=lambda i: (scores[i], -i))
    if scores[best] <= 0:
        return word_window(text, 0, max_chars)
    if spans[best][1] - spans[best][0] > max_chars:
        return word_window(text, max(spans[best][0], first[best] - LEAD_CHARS), max_chars)
    chosen: list[int] = []
    length = 0
    for i in sorted(range(len(spans)), key=lambda i: (-scores[i], i)):
        at = bisect.bisect_left(chosen, i)
        before = chosen[at - 1] if at else None
        after = chosen[at] if at < len(chosen) else None
        grown = length + spans[i][1] - spans[i][0] + _sep(spans, before, i) + _sep(spans, i, after)
        grown -= _sep(spans, before, after)
        if grown <= max_chars:
            chosen.insert(at, i)
            length = grown
    return "".join((_gap(text, spans, chosen[k - 1], i) if k else "") + text[spans[i][0]:spans[i][1]]
                   for k, i in enumerate(chosen))


def matched_stems(low: str, spans: list[tuple[int, int]], stems) -> tuple[list[set[str]], list[int]]:
    """For each sentence span of the lowercased text `low`: the set of `stems` among its tokens' stems
    (stem(t) for each TOKEN_RE token t), and the position of its first such token (the span's start if none)."""
    seen: list[set[str]] = [set() for _ in spans]
    first = [a for a, _ in spans]
    starts = [a for a, _ in spans]
    for m in _stem_pattern(frozenset(x for x in stems if TOKEN_RE.fullmatch(x))).finditer(low):
        i = bisect.bisect_right(starts, m.start()) - 1
        if i >= 0 and m.start() < spans[i][1]:  # not in the whitespace between two sentences
            if not seen[i]:
                first[i] = m.start()
            seen[i].add(m.group())
    return seen, first


@functools.lru_cache(maxsize=256)
def _stem_pattern(stems: frozenset[str]) -> re.Pattern:
    """One regex finding every token (a maximal run of TOKEN_RE's characters) whose stem is in `stems`: the token
    starts there, and a stem shorter than STEM_CHARS must also end the token. A single C-level scan of the text
    per snippet instead of a Python step per token; the stems are the keys of a query's weights, so the ten
    snippets of one search share one compiled pattern."""
    if not stems:
        return re.compile(r"(?!)")
    # Each alternative is the stem, then a lookbehind over it saying no token character precedes it (placed
    # after the literal so that sre scans for the stems' first characters instead of trying every position).
    alts = "|".join(re.escape(s) + rf"(?<![^\W_]{re.escape(s)})" + ("" if len(s) >= STEM_CHARS else r"(?![^\W_])")
                    for s in sorted(stems, key=lambda s: (-len(s), s)))
    return re.compile(f"(?:{alts})")


def _gap(text: str, spans: list[tuple[int, int]], before: int, i: int) -> str:
    """What joins chosen sentence `before` to chosen sentence `i`: the text between neighbours, else GAP."""
    return text[spans[before][1]:spans[i][0]] if i == before + 1 else GAP


def _sep(spans: list[tuple[int, int]], before: int | None, after: int | None) -> int:
    """len(_gap(...)) without building the string; 0 at either end of the snippet."""
    if before is None or after is None:
        return 0
    return spans[after][0] - spans[before][1] if after == before + 1 else len(GAP)
