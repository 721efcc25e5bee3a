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

    `text` is whitespace-collapsed; the result has at most `max_chars` characters.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    wanted: dict[str, float] = {}
    for term, w in weights.items():
        wanted[stem(term)] = max(wanted.get(stem(term), 0.0), w)
    spans = split_sentences(text)
    matches = [_matches(text, a, b, wanted) for a, b in spans]
    scores = [sum(wanted[s] for s in {s for _, s in m}) for m in matches]
    if not spans or max(scores) <= 0:
        return _word_window(text, 0, max_chars)
    order = sorted(range(len(spans)), key=lambda i: (-scores[i], i))
    best = order[0]
    if spans[best][1] - spans[best][0] > max_chars:
        first = matches[best][0][0]
        return _word_window(text, max(spans[best][0], first - _LEAD_CHARS), max_chars)
    chosen: list[int] = []
    for i in order:
        trial = sorted(chosen + [i])
        if len(_join(text, spans, trial)) <= max_chars:
            chosen = trial
    return _join(text, spans, chosen)


def _matches(text: str, a: int, b: int, wanted: Mapping[str, float]) -> list[tuple[int, str]]:
    """(position, stem) of the words of text[a:b] whose stem is a query term's."""
    found = ((m.start(), stem(m.group().lower())) for m in TOKEN_RE.finditer(text, a, b))
    return [(at, s) for at, s in found if s in wanted]


def _join(text: str, spans: list[tuple[int, int]], chosen: list[int]) -> str:
    """The chosen sentences in order: neighbours with the text between them, others with GAP."""
    parts = []
    for k, i in enumerate(chosen):
        if k:
            before = chosen[k - 1]
            parts.append(text[spans[before][1]:spans[i][0]] if i == before + 1 else GAP)
        parts.append(text[spans[i][0]:spans[i][1]])
    return "".join(parts)
