"""Broken tool calls of a rollout (RECIPE.md §5: schema compliance and `tool_choice=none` at b = 0).

A call is broken when it does not parse, names an unknown function, misses (or empties) the query, exceeds the
budget b, or appears at all when b = 0 (then every call is counted as `at_zero_budget`, whatever else is wrong
with it). A search that ran and failed in the backend is not the model's fault: it is counted apart, as a
search error.

The calls are read from the record's transcript (`RolloutRecord.turns`: each call's {name, arguments, ok,
error}, error being the agent's "malformed: <parser errors>" or the search tool's error code).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

CATEGORIES = ("parse", "unknown_function", "missing_query", "over_budget", "at_zero_budget")
_TOOL_ERRORS = {"budget_exceeded": "over_budget", "bad_arguments": "missing_query", "bad_query": "missing_query",
                "empty_query": "missing_query"}
_MALFORMED = (("unknown function", "unknown_function"), ("unknown tool", "unknown_function"),
              ("missing required parameter 'query'", "missing_query"))


def transcript_calls(turns: Iterable[Mapping[str, Any]] | None) -> list[Mapping[str, Any]]:
    """Every tool call of a transcript, in order."""
    return [call for turn in turns or () for call in turn.get("tool_calls") or ()]


def _category(error: str) -> str | None:
    """The broken-call category of a failed call's error, None for a backend failure."""
    if error.startswith("malformed"):
        return next((c for needle, c in _MALFORMED if needle in error), "parse")
    if error == "search_failed":
        return None
    return _TOOL_ERRORS.get(error, "parse")


def classify_calls(calls: Iterable[Mapping[str, Any]], budget: int) -> tuple[dict[str, int], int]:
    """(broken calls by category, search errors) of a rollout's calls (module docstring)."""
    broken: Counter = Counter({c: 0 for c in CATEGORIES})
    search_errors = 0
    for call in calls:
        if budget == 0:
            broken["at_zero_budget"] += 1
        elif not call.get("ok"):
            category = _category(str(call.get("error") or ""))
            if category is None:
                search_errors += 1
            else:
                broken[category] += 1
    return dict(broken), search_errors
