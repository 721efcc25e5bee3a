"""r_base agrees with the SFT data: every expert answer of the trajectories scores 1, hedges score 0."""

from __future__ import annotations

import json

import pytest

from searchjax.rewards import extract_answer, qa_correct


def test_every_expert_answer_is_correct(workspace):
    qa = {json.loads(line)["id"]: json.loads(line) for line in workspace["qa"].read_text().splitlines()}
    n = 0
    for line in workspace["sft"].read_text().splitlines():
        row = json.loads(line)
        if row["category"] not in ("single_turn", "two_turn", "multi_turn"):
            continue
        gold = qa[row["sources"][0]]
        answers = [m for m in row["messages"] if m["role"] == "assistant" and not m.get("tool_calls")]
        assert qa_correct(answers[0]["content"], [gold["answer"], *gold["aliases"]]), answers[0]["content"]
        n += 1
    assert n >= 10


@pytest.mark.parametrize("text, want", [
    ("The answer is Rob Fitzpatrick.", "Rob Fitzpatrick"),
    ("I searched twice. The answer is Paris", "Paris"),
    ("- The Mom Test\n- **Rob Fitzpatrick** (the answer)", "Rob Fitzpatrick"),
    ("| step | entity |\n|---|---|\n| 1 | The Mom Test |\n| 2 | Rob Fitzpatrick |", "Rob Fitzpatrick"),
    ("Rob Fitzpatrick", "Rob Fitzpatrick"),
])
def test_extract_answer_formats(text, want):
    assert extract_answer(text) == want


@pytest.mark.parametrize("hedge", [
    "The answer is Rob Fitzpatrick or Ann Smith.",
    "The answer is Rob Fitzpatrick. Or maybe the answer is Ann Smith.",
    "- **Rob Fitzpatrick** (the answer)\n- **Ann Smith** (the answer)",
    "It could be Rob Fitzpatrick, Ann Smith or Joe Bloggs.",
])
def test_hedges_listing_candidates_are_wrong(hedge):
    assert not qa_correct(hedge, ["Rob Fitzpatrick"])
