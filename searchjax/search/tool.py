"""The search_web tool contract (RECIPE.md §5) shared by SFT data, rollouts and evaluation.

Limits, held here for every backend:
- a query has at most MAX_QUERY_CHARS = 250 characters; a longer one is cut at the last word boundary at or
  before the limit (or hard-cut when its first word is longer) and the response says so;
- at most MAX_RESULTS = 10 results are rendered, in backend order, into a deterministic text;
- a rollout may make at most `max_calls` calls (5 in training; b under the budget-forced protocol,
  b = 0..10). A call past the budget executes no search, gets a response saying so and counts as failed.

Counters for the efficiency penalty (RECIPE.md §4): `calls` is c_i, every call the model made, valid or
not; `failures` is e_i, the calls whose execution failed (bad arguments, past the budget, backend error).
The tool's reward-relevant count is c̃_i = c_i − e_i.
"""

from __future__ import annotations

import dataclasses

from searchjax.search.types import SearchBackend, SearchResult

TOOL_NAME = "search_web"
MAX_QUERY_CHARS = 250
MAX_RESULTS = 10
TRAIN_MAX_CALLS = 5

SEARCH_WEB_TOOL: dict = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            f"Search the web and return up to {MAX_RESULTS} results, each with a title, a URL and a "
            f"snippet. The query is plain text of at most {MAX_QUERY_CHARS} characters (a longer one is "
            "cut at a word boundary). The number of calls per question is limited; calls past the limit fail."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "description": f"The search query, at most {MAX_QUERY_CHARS} characters.",
                }
            },
            "required": ["query"],
        },
    },
}


@dataclasses.dataclass(frozen=True)
class ToolCallResult:
    """The outcome of one search_web call.

    text: the tool-response text given back to the model (results or an error message);
    ok: whether the call executed (False counts towards e_i);
    error: a short machine-readable reason when not ok, else None;
    truncated_query: the query actually searched when the model's query was cut, else None.
    """

    text: str
    ok: bool
    error: str | None = None
    truncated_query: str | None = None


def budget_instruction(b: int) -> str:
    """The system-prompt sentence stating the hard cap of b search_web calls (budget-forced protocol)."""
    if not isinstance(b, int) or isinstance(b, bool) or b < 0:
        raise ValueError(f"tool-call budget must be a non-negative int, got {b!r}")
    if b == 0:
        return (
            f"You may not call the {TOOL_NAME} tool for this question (budget: 0 calls): "
            "answer from your own knowledge."
        )
    times = "once" if b == 1 else f"{b} times"
    return (
        f"You may call the {TOOL_NAME} tool at most {times} for this question; this is a hard limit, "
        "and any call beyond it will fail."
    )


def truncate_query(query: str, limit: int = MAX_QUERY_CHARS) -> str:
    """Cut `query` to at most `limit` characters at a word boundary; unchanged when already short enough.

    The cut keeps the longest prefix that ends before a whitespace character; a first word longer than
    the limit is hard-cut. Trailing whitespace of the kept prefix is dropped.
    """
    if len(query) <= limit:
        return query
    if query[limit].isspace():
        return query[:limit].rstrip()
    head = query[:limit]
    cut = max((i for i, ch in enumerate(head) if ch.isspace()), default=-1)
    kept = head[:cut].rstrip() if cut > 0 else ""
    return kept if kept else head


def render_results(query: str, results: list[SearchResult]) -> str:
    """Deterministic tool-response text for the results of `query` (at most MAX_RESULTS)."""
    if not results:
        return f'No results found for "{query}".'
    blocks = [f'Search results for "{query}":']
    for i, r in enumerate(results[:MAX_RESULTS], 1):
        blocks.append(f"[{i}] {r.title}\nURL: {r.url}\n{r.snippet}")
    return "\n\n".join(blocks)


class SearchTool:
    """Per-rollout search_web state: the call budget and the counters c_i (`calls`), e_i (`failures`).

    `max_results` (1..MAX_RESULTS) is how many results a call shows: the contract's ceiling is 10; a small policy
    trained on CPU sees fewer, so that a trajectory fits its context (the SFT data and the rollouts must agree)."""

    def __init__(self, backend: SearchBackend, max_calls: int = TRAIN_MAX_CALLS, max_results: int = MAX_RESULTS):
        if not isinstance(max_calls, int) or isinstance(max_calls, bool) or max_calls < 0:
            raise ValueError(f"max_calls must be a non-negative int, got {max_calls!r}")
        if not isinstance(max_results, int) or isinstance(max_results, bool) or not 1 <= max_results <= MAX_RESULTS:
            raise ValueError(f"max_results must be an int in [1, {MAX_RESULTS}], got {max_results!r}")
        self.backend = backend
        self.max_calls = max_calls
        self.max_results = max_results
        self.calls = 0
        self.failures = 0

    @property
    def remaining(self) -> int:
        return max(0, self.max_calls - self.calls)

    def _fail(self, error: str, text: str) -> ToolCallResult:
        self.failures += 1
        return ToolCallResult(text=f"Error: {text}", ok=False, error=error)

    def call(self, arguments: object) -> ToolCallResult:
        """Execute one search_web call with the model's `arguments`; never raises.

        Every call counts in `calls`; one that does not execute (over budget, bad arguments, backend
        failure) also counts in `failures` and its text starts with "Error:".
        """
        self.calls += 1
        if self.calls > self.max_calls:
            return self._fail(
                "budget_exceeded",
                f"the {TOOL_NAME} call budget of {self.max_calls} for this question is used up; "
                "no search was run. Answer with what you have.",
            )
        if not isinstance(arguments, dict):
            return self._fail("bad_arguments", "arguments must be an object with a 'query' string.")
        query = arguments.get("query")
        if not isinstance(query, str):
            got = "nothing" if query is None else type(query).__name__
            return self._fail("bad_query", f"'query' must be a string, got {got}.")
        query = query.strip()
        if not query:
            return self._fail("empty_query", "'query' is empty.")
        return self._search(query)

    def _search(self, query: str) -> ToolCallResult:
        cut = truncate_query(query)
        try:
            results = list(self.backend.search(cut, self.max_results))
            if not all(isinstance(r, SearchResult) for r in results):
                raise TypeError("backend returned something other than SearchResult")
        # Any backend failure, whatever its type, must become a tool error: a rollout never dies of search.
        except Exception as e:  # noqa: BLE001
            return self._fail("search_failed", f"the search failed ({type(e).__name__}: {e}).")
        text = render_results(cut, results)
        if cut != query:
            note = (
                f"Note: the query was longer than {MAX_QUERY_CHARS} characters and was cut to "
                f'"{cut}".'
            )
            return ToolCallResult(text=f"{note}\n\n{text}", ok=True, truncated_query=cut)
        return ToolCallResult(text=text, ok=True)
