"""Broken tool calls by category, from a rollout's transcript of calls."""

from searchjax.eval.calls import CATEGORIES, classify_calls, transcript_calls


def _c(**kw):
    return {c: kw.get(c, 0) for c in CATEGORIES}


def _call(ok=False, error=None):
    return {"name": "search_web", "arguments": {"query": "x"}, "ok": ok, "error": error}


def test_each_category():
    turns = [{"text": "...", "tool_calls": [_call(True), _call(error="malformed: missing <function=NAME>")]},
             {"text": "...", "tool_calls": [
                 _call(error="malformed: unknown function 'open_url' (known: search_web)"),
                 _call(error="malformed: missing required parameter 'query'"), _call(error="empty_query"),
                 _call(error="bad_arguments"), _call(error="search_failed")]},
             {"text": "...", "tool_calls": []}, {"text": "...", "tool_calls": [_call(error="budget_exceeded")] * 2}]
    broken, search_errors = classify_calls(transcript_calls(turns), budget=2)
    assert broken == _c(parse=1, unknown_function=1, missing_query=3, over_budget=2) and search_errors == 1


def test_every_call_at_budget_zero_is_broken():
    calls = [_call(error="budget_exceeded"), _call(error="malformed: garbage"), _call(error="budget_exceeded")]
    assert classify_calls(calls, 0) == (_c(at_zero_budget=3), 0)
    assert classify_calls(transcript_calls(None), 0) == (_c(), 0)
