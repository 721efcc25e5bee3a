"""Rubric chat data: template prompts obey their own rubrics, LLM rubric writer, pass@4 calibration."""

from __future__ import annotations

import json

import pytest

from searchjax.data.rubric_data import (
    CATEGORIES,
    LLMRubricGenerator,
    calibrate_pass_at_k,
    generate_rubric_records,
    validate_rubric_record,
)
from searchjax.rewards.rubrics import Rubric, RuleJudge, evaluate_rubrics


@pytest.fixture(scope="module")
def records():
    return generate_rubric_records(200, seed=7)


def test_records_are_deterministic_and_valid(records):
    assert generate_rubric_records(200, seed=7) == records
    assert generate_rubric_records(200, seed=8) != records
    assert {r["category"] for r in records} == set(CATEGORIES)
    for r in records:
        validate_rubric_record(r)
        priorities = [x["priority"] for x in r["rubrics"]]
        assert priorities == sorted(priorities), r["id"]  # the write-up's priority order


def test_reference_passes_and_prompt_echo_fails(records):
    judge = RuleJudge()
    for r in records:
        rubrics = [Rubric.from_dict(x) for x in r["rubrics"]]
        prompt = r["messages"][-1]["content"]
        assert all(evaluate_rubrics(prompt, r["reference"], rubrics, judge)), (r["id"], r["reference"])
        if r["category"] != "plan":
            assert not all(evaluate_rubrics(prompt, prompt, rubrics, judge)), r["id"]


def test_pass_at_4_calibration_drops_all_and_none(records):
    # A policy that answers with the reference on some samples and echoes the prompt on the others, by prompt.
    def policy(messages, j):
        rec = by_prompt[messages[-1]["content"]]
        mode = int(rec["id"][-6:]) % 3  # 0: always right, 1: never right, 2: right on samples 0 and 2
        right = mode == 0 or (mode == 2 and j % 2 == 0)
        return rec["reference"] if right else messages[-1]["content"]

    subset = [r for r in records if r["category"] != "plan"][:60]
    by_prompt = {r["messages"][-1]["content"]: r for r in subset}
    assert len(by_prompt) == len(subset)
    kept, report = calibrate_pass_at_k(subset, policy, RuleJudge(), k=4)
    expect_kept = sum(int(r["id"][-6:]) % 3 == 2 for r in subset)
    assert report.n == 60 and report.kept == len(kept) == expect_kept
    assert report.all_pass == sum(int(r["id"][-6:]) % 3 == 0 for r in subset)
    assert report.all_fail == 60 - report.kept - report.all_pass
    assert report.kept_fraction == pytest.approx(expect_kept / 60)
    assert all(k["pass_at_k"] == "2/4" for k in kept)


def test_llm_rubric_writer_through_chat_client():
    def client(messages):
        assert messages[0]["role"] == "system" and messages[-1]["role"] == "user"
        return "Here you go: " + json.dumps({"reference": "Fixed.", "rubrics": [
            {"text": "has Fixed", "kind": "contains", "params": {"all": ["Fixed"]}, "priority": 2},
            {"text": "English", "kind": "language", "params": {"lang": "en"}, "priority": 0}]})

    recs = generate_rubric_records(3, seed=1, writer=LLMRubricGenerator(client))
    assert [x["priority"] for x in recs[0]["rubrics"]] == [0, 2] and recs[0]["reference"] == "Fixed."
    with pytest.raises(ValueError, match="non-empty rubric list"):
        LLMRubricGenerator(lambda m: '{"reference": "x", "rubrics": []}')([{"role": "user", "content": "hi"}])


def test_invalid_rubric_record_is_named():
    rec = generate_rubric_records(1, seed=0)[0]
    with pytest.raises(KeyError):
        validate_rubric_record({k: v for k, v in rec.items() if k != "reference"})
    with pytest.raises(ValueError, match="unknown kind"):
        validate_rubric_record({**rec, "rubrics": [{"text": "x", "kind": "vibes"}]})


@pytest.mark.parametrize("change, error, message", [
    ({"messages": ["hi"]}, TypeError, r"'messages'\[0\]"),
    ({"messages": []}, ValueError, "must end with a user turn"),
    ({"rubrics": []}, ValueError, "at least one rubric"),
    ({"rubrics": ["x"]}, TypeError, r"'rubrics'\[0\]"),
    ({"rubrics": [{"text": "x", "kind": "contains", "params": {"all": "lodging"}}]}, ValueError,
     "non-empty list of non-empty strings"),
    ({"rubrics": [{"text": "x", "kind": "length", "params": {"max_words": "80"}}]}, ValueError, "must be int"),
    ({"rubrics": [{"text": 3, "kind": "no_citations"}]}, TypeError, "must be strings"),
])
def test_malformed_rubric_rows_are_named(change, error, message):
    rec = generate_rubric_records(1, seed=0)[0]
    with pytest.raises(error, match=message):
        validate_rubric_record({**rec, **change})


def test_rubric_writer_reply_errors_are_model_reply_errors():
    from searchjax.rewards.rubrics import ModelReplyError

    bad = json.dumps({"reference": "x", "rubrics": [{"text": "t", "kind": "contains", "params": {}}]})
    with pytest.raises(ModelReplyError, match="invalid rubric"):
        LLMRubricGenerator(lambda m: bad)([{"role": "user", "content": "hi"}])
    with pytest.raises(ModelReplyError, match="no JSON object"):
        LLMRubricGenerator(lambda m: "sorry")([{"role": "user", "content": "hi"}])


def test_calibration_needs_k_of_at_least_two():
    with pytest.raises(ValueError, match="k must be >= 2"):
        calibrate_pass_at_k(generate_rubric_records(1, seed=0), lambda m, j: "x", None, k=1)
