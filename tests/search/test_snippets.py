"""Query-focused snippets: whole sentences chosen by their query terms, within the character limit."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.search import MemoryBackend
from searchjax.search.snippets import GAP, STEM_CHARS, idf, matched_stems, query_snippet, split_sentences
from searchjax.search.types import TOKEN_RE

DOC = ("Union of Vesuto Chemists is an organisation. The headquarters of Union of Vesuto Chemists are in Jipom. "
       "Union of Vesuto Chemists dates from 2014. Kouwun Zazirk is among its members. "
       "Union of Vesuto Chemists was founded by Cekous Stamiav.")


def weights(*terms, common=()):
    return {t: idf(1000, 900 if t in common else 3) for t in terms}


def test_the_sentence_with_the_relation_is_shown_whole():
    w = weights("founder", "union", "vesuto", "chemists", common=("union",))
    snip = query_snippet(DOC, w, 200)
    assert "Union of Vesuto Chemists was founded by Cekous Stamiav." in snip  # "founder" meets "founded"
    assert len(snip) <= 200
    # The rest is filled with whole sentences in document order; the last sentence is not a neighbour of the
    # one before it, so a gap marks the cut.
    pieces = snip.split(GAP)
    assert len(pieces) == 2 and all(p in DOC for p in pieces)
    assert DOC.index(pieces[0]) < DOC.index(pieces[1])


def test_neighbouring_sentences_keep_their_own_separator():
    text = "Alpha one. Beta two!  Gamma three? Delta four."
    text = " ".join(text.split())
    assert query_snippet(text, weights("beta", "gamma"), 200) == text
    assert query_snippet(text, weights("beta", "gamma"), 24) == "Beta two! Gamma three?"


def test_a_rare_term_outweighs_a_common_one():
    text = "The city is big. The capital is Varnholm."
    w = {"city": idf(1000, 800), "varnholm": idf(1000, 2)}
    assert query_snippet(text, w, 30) == "The capital is Varnholm."


def test_no_match_shows_the_opening_word_aligned():
    text = "first words of a document that goes on and on without the query term"
    assert query_snippet(text, weights("zebra"), 20) == "first words of a"
    assert query_snippet(text, {}, 20) == "first words of a"


def test_a_long_sentence_is_windowed_around_its_first_match():
    text = " ".join(f"filler{i}" for i in range(60)) + " the needle sits here " + "tail " * 40
    snip = query_snippet(text.strip(), weights("needle"), 80)
    assert "the needle sits here" in snip and len(snip) <= 80
    assert not snip.startswith("iller") and "filler0 " not in snip


def test_ideographic_full_stops_split_sentences():
    text = "東京は首都です。人口は多い。"
    assert [text[a:b] for a, b in split_sentences(text)] == ["東京は首都です。", "人口は多い。"]
    assert query_snippet(text, {"人口は多い": 1.0}, 8) == "人口は多い。"


def test_memory_backend_uses_focused_snippets():
    docs = [{"title": "U", "url": "u0", "text": DOC}, {"title": "V", "url": "u1", "text": "Nothing to see."}]
    (hit,) = MemoryBackend(docs).search("founder of Union of Vesuto Chemists", 1)
    assert "was founded by Cekous Stamiav." in hit.snippet


words = st.sampled_from(["alpha", "beta", "gamma", "delta", "Zeta", "x", "2,201,941", "Ωmega", "東京"])
sentence = st.lists(words, min_size=1, max_size=12).map(" ".join).map(lambda s: s + st_end(s))


def st_end(s: str) -> str:
    return "." if len(s) % 3 else "?"


@settings(max_examples=300, deadline=None)
@given(st.lists(sentence, min_size=1, max_size=8), st.lists(words, max_size=4), st.integers(1, 120))
def test_snippets_are_bounded_and_made_of_the_text(sentences, terms, max_chars):
    text = " ".join(sentences)
    w = {t.lower(): 1.0 + i for i, t in enumerate(terms)}
    snip = query_snippet(text, w, max_chars)
    assert len(snip) <= max_chars
    for piece in snip.split(GAP):
        assert piece in text


def _reference_matches(low, spans, stems):
    """The definition matched_stems implements with one regex: every token of every sentence, one at a time."""
    seen, first = [], []
    for a, b in spans:
        hits = [(m.start(), m.group()[:STEM_CHARS]) for m in TOKEN_RE.finditer(low, a, b)]
        hits = [(at, s) for at, s in hits if s in stems]
        seen.append({s for _, s in hits})
        first.append(hits[0][0] if hits else a)
    return seen, first


tokens = st.sampled_from(["found", "founded", "founder", "foun", "x", "x_y", "2,201", "ωmega", "東京", "a.b",
                          "organiser", "organised", "orga", "İstanbul", "q?", "!", "。"])


@settings(max_examples=400, deadline=None)
@given(st.lists(tokens, min_size=1, max_size=30), st.lists(st.sampled_from(["  ", " ", ". ", "", "_"]),
       min_size=30, max_size=30), st.sets(st.sampled_from(["found", "founde", "foun", "x", "y", "2", "201",
                                                        "ωmega", "東京", "a.b", "organi", "orga", "i̇stanb", "q"])))
def test_matched_stems_is_the_per_token_definition(words, seps, stems):
    text = " ".join("".join(w + s for w, s in zip(words, seps)).split())
    low = text.lower()
    if len(low) != len(text):
        low = "".join(c.lower()[0] for c in text)
    spans = split_sentences(text)
    assert matched_stems(low, spans, stems) == _reference_matches(low, spans, stems)


def _reference_sentences(text):
    """split_sentences's definition: a sentence ends after . ! ? followed by whitespace, or after "。"."""
    spans, start = [], 0
    for m in re.finditer(r"(?<=[.!?])\s+|(?<=。)\s*", text):
        if m.start() > start:
            spans.append((start, m.start()))
        start = m.end()
    if start < len(text):
        spans.append((start, len(text)))
    return spans


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="ab .!?。 \n", max_size=40))
def test_split_sentences_is_its_definition(text):
    assert split_sentences(text) == _reference_sentences(text)
