"""SnippetIndex: the per-document work done once, and every snippet the same as snippets.query_snippet."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.search.snippet_index import SnippetIndex
from searchjax.search.snippets import idf, query_snippet

# Tokens that meet the edge cases: stems of 6 and fewer characters, prefixes of each other, digits, "_" (a
# separator), letters whose lowercase is longer ("İ") or depends on context (final "Σ"), other scripts.
tokens = st.sampled_from(["found", "Founded", "founder", "FOUN", "x", "X_y", "2,201", "ΩMEGA", "ΟΔΟΣ", "東京",
                          "a.b", "organiser", "organised", "orga", "İstanbul", "q?", "!", "。", "Kraegy", "raegy",
                          "the", "année", "ﬁnd", "①", "x2"])
seps = st.sampled_from([" ", " ", " ", ". ", "! ", "? ", "。", "", "_", "-", "  "])
weight = st.one_of(st.floats(0.01, 10.0), st.sampled_from([1.0, 2.0, idf(1000, 3), idf(1000, 900)]))
terms = st.sampled_from(["found", "founded", "founder", "foun", "x", "y", "2", "201", "ωmega", "οδοσ", "οδος",
                         "東京", "a.b", "organiser", "orga", "i̇stanbul", "istanbul", "q", "kraegydraeth",
                         "raegy", "the", "année", "find", "①", "x2", "", "Found"])


@st.composite
def texts(draw):
    words = draw(st.lists(tokens, min_size=1, max_size=60))
    joined = "".join(w + draw(seps) for w in words)
    return " ".join(joined.split())


def test_str_isalnum_is_a_token_character():
    """_stem_hits tests token boundaries with str.isalnum; TOKEN_RE's characters are `[^\\W_]`."""
    token_char = re.compile(r"[^\W_]")
    assert all(c.isalnum() == bool(token_char.match(c)) for c in map(chr, range(sys.maxunicode + 1)))


@settings(max_examples=1500, deadline=None)
@given(st.lists(texts(), min_size=1, max_size=4), st.dictionaries(terms, weight, min_size=1, max_size=6),
       st.integers(1, 150))
def test_snippets_equal_the_reference(rows, weights, max_chars):
    index = SnippetIndex(rows, max_chars)
    query = index.query(weights)
    for row, text in enumerate(rows):
        assert index.snippet(row, query) == query_snippet(text, weights, max_chars)


@settings(max_examples=300, deadline=None)
@given(texts(), st.dictionaries(terms, st.sampled_from([0.0, -1.0, 1.0, float("nan")]), max_size=4),
       st.integers(1, 80))
def test_weights_that_are_not_positive_fall_back_to_the_reference(text, weights, max_chars):
    assert SnippetIndex([text], max_chars).snippet(0, SnippetIndex.query(weights)) == query_snippet(
        text, weights, max_chars)


def test_ties_keep_the_earlier_sentence():
    text = "Alpha beta one. Gamma two. Alpha beta three. Gamma four."
    index = SnippetIndex([text], 20)
    for weights in ({"alpha": 1.0, "beta": 1.0}, {"gamma": 1.0}, {"alpha": 0.1, "beta": 0.2, "gamma": 0.3}):
        assert index.snippet(0, index.query(weights)) == query_snippet(text, weights, 20)


_HASH_SEED_SCRIPT = """
from searchjax.search.snippet_index import SnippetIndex
from searchjax.search.snippets import query_snippet
text = ("Febroubond Forge is a startup accelerator. The winter 2009 cohort of Febroubond Forge included Dokiavou "
        "Security. Febroubond Forge accepted Maegrax Labs into its winter 1991 cohort. The summer 2022 cohort of "
        "Febroubond Forge included Grinor Analytics.")
w = {"company": 0.7310585786, "winter": 1.3862943611, "cohort": 0.4054651081, "febroubond": 3.1415926535,
     "forge": 2.7182818284, "2023": 5.0}
index = SnippetIndex([text], 120)
print(query_snippet(text, w, 120))
print(index.snippet(0, index.query(w)))
"""


def test_snippets_do_not_depend_on_the_hash_seed():
    """Two sentences hold the same query stems (in another order): a tie, kept by the earlier one in every process.
    The score was a sum() over a set, whose order follows the per-process string hash seed, and 2 of 12 seeds
    chose the later sentence."""
    outputs = set()
    for seed in range(16):
        env = dict(os.environ, PYTHONHASHSEED=str(seed))
        out = subprocess.run([sys.executable, "-c", _HASH_SEED_SCRIPT], env=env, capture_output=True, text=True,
                             check=True).stdout
        outputs.add(out)
    assert len(outputs) == 1
    first, second = outputs.pop().splitlines()
    assert first == second and first.endswith("The winter 2009 cohort of Febroubond Forge included Dokiavou Security.")


def test_short_texts_need_no_spans():
    index = SnippetIndex(["short.", "a long one. It has two sentences."], 10)
    assert list(index._offsets) == [0, 0, 2]
    assert index.snippet(0, index.query({"short": 1.0})) == "short."
    with pytest.raises(ValueError):
        SnippetIndex([], 0)


def test_the_world_index_shows_the_reference_snippets(kb, tantivy_backend):
    """Every hit of first-hop queries and entity names on the test world: TantivyBackend's snippets are
    query_snippet's (reference_search), and so are its titles and urls."""
    queries = [kb.describe_object(r) for r in kb.relations[:300]] + [e.name for e in kb.by_type("company")[:50]]
    hits = 0
    for q in queries:
        results = tantivy_backend.search(q, 10)
        assert results == tantivy_backend.reference_search(q, 10), q
        hits += len(results)
    assert hits > 3000
