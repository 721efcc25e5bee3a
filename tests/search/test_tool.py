"""The search_web contract: query length, result count, call budget, bad arguments, backend failures."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.search import (
    MAX_QUERY_CHARS,
    MAX_RESULTS,
    SEARCH_WEB_TOOL,
    MemoryBackend,
    SearchError,
    SearchResult,
    SearchTool,
    budget_instruction,
    render_results,
    truncate_query,
)


class Recording:
    """A backend that records the queries it ran and returns `n` fixed results."""

    def __init__(self, n: int = 3):
        self.queries: list[str] = []
        self.n = n

    def search(self, query: str, k: int = 10) -> list[SearchResult]:
        self.queries.append(query)
        return [SearchResult(f"t{i}", f"https://e.example/{i}", f"s{i}") for i in range(self.n)]


class Failing:
    def __init__(self, exc: Exception):
        self.exc = exc

    def search(self, query, k=10):
        raise self.exc


def test_251_char_query_is_cut_at_a_word_boundary_and_the_response_says_so():
    query = ("alpha " * 50)[:MAX_QUERY_CHARS] + "z"  # 251 chars, the last word straddles the limit
    assert len(query) == 251
    backend = Recording()
    result = SearchTool(backend).call({"query": query})
    assert result.ok and result.truncated_query is not None
    assert len(result.truncated_query) <= MAX_QUERY_CHARS
    assert query.startswith(result.truncated_query) and not result.truncated_query.endswith(" ")
    assert query[len(result.truncated_query)] == " "  # cut before a space: no word split
    assert backend.queries == [result.truncated_query]
    assert "cut to" in result.text and str(MAX_QUERY_CHARS) in result.text


def test_query_of_exactly_250_chars_is_untouched():
    query = "b" * 250
    result = SearchTool(Recording()).call({"query": query})
    assert result.ok and result.truncated_query is None and "cut to" not in result.text


def test_one_long_word_is_hard_cut():
    assert truncate_query("x" * 300) == "x" * MAX_QUERY_CHARS
    assert truncate_query("y" * 10 + " " + "x" * 300) == "y" * 10


def test_eleven_hits_render_ten():
    docs = [{"title": f"Doc {i}", "url": f"https://e.example/{i}", "text": "common word"} for i in range(15)]
    result = SearchTool(MemoryBackend(docs)).call({"query": "common"})
    assert result.ok
    assert result.text.count("URL: ") == MAX_RESULTS
    assert "[10] Doc 9" in result.text and "[11]" not in result.text
    many = [SearchResult(f"t{i}", f"u{i}", "s") for i in range(12)]
    assert render_results("q", many).count("URL: ") == MAX_RESULTS


def test_sixth_call_fails_and_counts():
    backend = Recording()
    tool = SearchTool(backend, max_calls=5)
    outcomes = [tool.call({"query": f"q{i}"}) for i in range(6)]
    assert [o.ok for o in outcomes] == [True] * 5 + [False]
    assert outcomes[-1].error == "budget_exceeded" and "budget" in outcomes[-1].text
    assert backend.queries == [f"q{i}" for i in range(5)]
    assert (tool.calls, tool.failures) == (6, 1)


def test_budget_zero_executes_no_search():
    backend = Recording()
    tool = SearchTool(backend, max_calls=0)
    for _ in range(3):
        assert tool.call({"query": "anything"}).error == "budget_exceeded"
    assert backend.queries == [] and (tool.calls, tool.failures) == (3, 3)


@pytest.mark.parametrize(
    "arguments, error",
    [({}, "bad_query"), ({"query": 3}, "bad_query"), ({"query": None}, "bad_query"), ({"query": ""}, "empty_query"),
     ({"query": "  \n"}, "empty_query"), ("query", "bad_arguments"), (None, "bad_arguments"), ([1], "bad_arguments")],
)
def test_bad_arguments_are_failed_calls(arguments, error):
    backend = Recording()
    tool = SearchTool(backend)
    result = tool.call(arguments)
    assert not result.ok and result.error == error and result.text.startswith("Error:")
    assert backend.queries == [] and (tool.calls, tool.failures) == (1, 1)


@pytest.mark.parametrize("exc", [SearchError("down"), TimeoutError("slow"), RuntimeError("boom"), KeyError("x")])
def test_backend_failures_become_error_results(exc):
    tool = SearchTool(Failing(exc))
    result = tool.call({"query": "q"})
    assert not result.ok and result.error == "search_failed" and type(exc).__name__ in result.text
    assert tool.call({"query": "again"}).error == "search_failed"  # the rollout goes on
    assert (tool.calls, tool.failures) == (2, 2)


def test_backend_returning_garbage_is_an_error():
    class Garbage:
        def search(self, query, k=10):
            return [{"title": "not a SearchResult"}]

    assert SearchTool(Garbage()).call({"query": "q"}).error == "search_failed"


def test_rendering_is_deterministic_and_complete():
    results = [SearchResult("A title", "https://a.example/1", "a snippet")]
    text = render_results("my query", results)
    assert text == 'Search results for "my query":\n\n[1] A title\nURL: https://a.example/1\na snippet'
    assert render_results("none", []) == 'No results found for "none".'


def test_tool_schema_and_budget_instruction():
    fn = SEARCH_WEB_TOOL["function"]
    assert fn["name"] == "search_web" and fn["parameters"]["required"] == ["query"]
    assert fn["parameters"]["properties"]["query"]["type"] == "string"
    assert "250" in fn["description"] and "10" in fn["description"]
    assert "not call" in budget_instruction(0)
    assert "at most once" in budget_instruction(1)
    for b in range(2, 11):
        assert f"at most {b} times" in budget_instruction(b)
    with pytest.raises(ValueError, match="budget"):
        budget_instruction(-1)
    with pytest.raises(ValueError, match="max_calls"):
        SearchTool(Recording(), max_calls=-2)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=400),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                     max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_JSON, st.dictionaries(st.just("query"), _JSON, min_size=1)), st.integers(0, 3))
def test_call_never_raises_and_counts(arguments, budget):
    docs = [{"title": "T", "url": "u", "text": "some words here"}]
    tool = SearchTool(MemoryBackend(docs), max_calls=budget)
    for _ in range(budget + 1):
        result = tool.call(arguments)
        assert isinstance(result.text, str) and result.text
        assert result.ok == (result.error is None)
    assert tool.calls == budget + 1 and tool.failures >= 1
    if isinstance(result.truncated_query, str):
        assert len(result.truncated_query) <= MAX_QUERY_CHARS
