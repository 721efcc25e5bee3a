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
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Mapping

from searchjax.search.types import TOKEN_RE

STEM_CHARS = 6
GAP = " ... "
_LEAD_CHARS = 60  # context kept before the first matched term when one sentence alone is too long
# A sentence ends at . ! ? or an ideographic full stop, followed by whitespace (or, after "。", by anything).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=。)\s*")


def stem(term: str) -> str:
    return term[:STEM_CHARS]


def idf(num_docs: int, doc_freq: int) -> float:
    """ln(1 + N / (1 + df)): the weight of a term found in `doc_freq` of `num_docs` documents."""
    return math.log1p(num_docs / (1 + doc_freq))


def split_sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the sentences of whitespace-collapsed `text`, in order."""
    spans, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        if m.start() > start:
            spans.append((start, m.start()))
        start = m.end()
    if start < len(text):
        spans.append((start, len(text)))
    return spans


def _word_window(text: str, start: int, max_chars: int) -> str:
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
    wanted: dict[str, float] = {}
    for term, w in weights.items():
        wanted[stem(term)] = max(wanted.get(stem(term), 0.0), w)
    spans = split_sentences(text)
    if not spans:
        return ""
    low = text.lower()
    if len(low) != len(text):  # a letter whose lowercase is longer ("İ"): positions must stay the text's
        low = "".join(c.lower()[0] for c in text)
    seen: list[set[str]] = []
    first: list[int] = []
    for a, b in spans:
        hits = [(m.start(), m.group()[:STEM_CHARS]) for m in TOKEN_RE.finditer(low, a, b)]
        hits = [(at, st) for at, st in hits if st in wanted]
        seen.append({st for _, st in hits})
        first.append(hits[0][0] if hits else a)
    scores = [sum(wanted[x] for x in found) for found in seen]
    best = max(range(len(spans)), key=lambda i: (scores[i], -i))
    if scores[best] <= 0:
        return _word_window(text, 0, max_chars)
    if spans[best][1] - spans[best][0] > max_chars:
        return _word_window(text, max(spans[best][0], first[best] - _LEAD_CHARS), max_chars)
    chosen: list[int] = []
    length = 0
    for i in sorted(range(len(spans)), key=lambda i: (-scores[i], i)):
        at = bisect.bisect_left(chosen, i)
        before = chosen[at - 1] if at else None
        after = chosen[at] if at < len(chosen) else None
        grown = length + spans[i][1] - spans[i][0] + _sep(text, spans, before, i) + _sep(text, spans, i, after)
        grown -= _sep(text, spans, before, after)
        if grown <= max_chars:
            chosen.insert(at, i)
            length = grown
    return "".join((_gap(text, spans, chosen[k - 1], i) if k else "") + text[spans[i][0]:spans[i][1]]
                   for k, i in enumerate(chosen))


def _gap(text: str, spans: list[tuple[int, int]], before: int, i: int) -> str:
    """What joins chosen sentence `before` to chosen sentence `i`: the text between neighbours, else GAP."""
    return text[spans[before][1]:spans[i][0]] if i == before + 1 else GAP


def _sep(text: str, spans: list[tuple[int, int]], before: int | None, after: int | None) -> int:
    return 0 if before is None or after is None else len(_gap(text, spans, before, after))
