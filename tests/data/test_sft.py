"""SFT data: expert trajectories (single/two/multi-turn), abstention, preference examples; masks and pipeline."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from searchjax.chat import encode_conversation, parse_assistant, render
from searchjax.chat.parser import rejection_response
from searchjax.config import configs_dir, load_yaml
from searchjax.data.jsonl import write_jsonl
from searchjax.data.pipeline import PipelineConfig, build_dataset
from searchjax.data.rubric_data import generate_rubric_records
from searchjax.data.sft import SFTBuilder, validate_sft_record
from searchjax.data.solvers import SearchSolver
from searchjax.data.synth import QAGenerator, SynthConfig
from searchjax.search import SEARCH_WEB_TOOL


@pytest.fixture(scope="module")
def qa_records(kb, backend):
    return list(QAGenerator(kb, SearchSolver(backend), SynthConfig(n=24, seed=5, augment_fraction=0.5)).generate())


@pytest.fixture(scope="module")
def sft_records(kb, backend, qa_records):
    qa = qa_records
    builder = SFTBuilder(kb, backend, seed=0)
    records = list(builder.build(qa, generate_rubric_records(10, seed=2), n_abstention=4))
    return records, builder.summary


def test_categories_and_schema(sft_records):
    records, summary = sft_records
    cats = Counter(r["category"] for r in records)
    for c in ("single_turn", "two_turn", "multi_turn", "abstention", "correct", "translate"):
        assert cats[c] > 0, cats
    for r in records:
        validate_sft_record(r)
        render(r["messages"], [SEARCH_WEB_TOOL], add_generation_prompt=False)  # renders in production format
    assert sum(v for k, v in summary.items() if k.startswith("kept:")) == len(records)
    turns = {c: max(sum(m["role"] == "user" for m in r["messages"]) for r in records if r["category"] == c)
             for c in ("single_turn", "two_turn", "multi_turn")}
    assert turns == {"single_turn": 1, "two_turn": 2, "multi_turn": 3}


def test_tool_calls_round_trip_through_the_parser(sft_records):
    for r in sft_records[0]:
        for m in r["messages"]:
            if m.get("tool_calls"):
                text = render([{"role": "user", "content": "q"}, m], [SEARCH_WEB_TOOL], add_generation_prompt=False)
                turn = text.split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>", 1)[0]
                parsed_text = turn.removeprefix("<think>\n")  # the generation prompt opens the thinking block
                parsed = parse_assistant(parsed_text, [SEARCH_WEB_TOOL])
                assert not parsed.errors
                assert parsed.tool_calls[0].arguments == m["tool_calls"][0]["function"]["arguments"]


def test_abstention_declines(sft_records):
    for r in sft_records[0]:
        if r["category"] == "abstention":
            assert "found no reliable source" in r["messages"][-1]["content"]
            assert r["messages"][2]["tool_calls"] and r["messages"][3]["role"] == "tool"


def test_loss_mask_on_assistant_tokens_only(sft_records, tokenizer):
    r = next(x for x in sft_records[0] if x["category"] == "two_turn")
    ids, mask = encode_conversation(r["messages"], tokenizer, [SEARCH_WEB_TOOL])
    learned = tokenizer.decode(ids[mask == 1].tolist())
    assert "Search results for" not in learned and r["messages"][1]["content"] not in learned
    assert r["messages"][-1]["content"] in learned and "<tool_call>" in learned


def test_sft_mix_pipeline(sft_records, tokenizer, tmp_path):
    records = sft_records[0]
    traj = [r for r in records if r["category"] in ("single_turn", "two_turn", "multi_turn")]
    pref = [r for r in records if r not in traj]
    write_jsonl(tmp_path / "t.jsonl", traj)
    write_jsonl(tmp_path / "p.jsonl", pref)
    cfg = load_yaml(PipelineConfig, configs_dir() / "data" / "sft_mix.yaml")
    cfg = dataclasses.replace(cfg, batch_size=4, sources=(
        dataclasses.replace(cfg.sources[0], path=str(tmp_path / "t.jsonl")),
        dataclasses.replace(cfg.sources[1], path=str(tmp_path / "p.jsonl"))))
    batch = build_dataset(cfg, tokenizer, process_index=0, process_count=1)[0]
    assert batch["input_ids"].shape == (4, cfg.max_len)
    assert (batch["loss_mask"].sum(axis=1) > 0).all()
    for row, mask, n in zip(batch["input_ids"], batch["loss_mask"], batch["lengths"]):
        assert not mask[n:].any() and (row[n:] == tokenizer.special.pad).all()
    np.testing.assert_array_equal(batch["source"] >= 0, True)


def test_follow_up_answers_keep_names(sft_records):
    checked = 0
    for r in sft_records[0]:
        if r["category"] in ("two_turn", "multi_turn"):
            users = [i for i, m in enumerate(r["messages"]) if m["role"] == "user"]
            phrase = r["messages"][users[1]]["content"].removeprefix("What is ").removesuffix("?")
            answer = r["messages"][users[2] - 1 if len(users) > 2 else -1]["content"]
            assert answer.startswith(phrase[0].upper() + phrase[1:] + " is "), (phrase, answer)  # names keep capitals
            checked += 1
    assert checked


@pytest.mark.parametrize("messages, error, match", [
    ([], ValueError, "last turn must be an assistant"),
    (["hi"], TypeError, r"'messages'\[0\]"),
    ([{"role": "user", "content": "hi"}], ValueError, "last turn must be an assistant"),
])
def test_malformed_sft_rows_are_named(messages, error, match):
    row = {"id": "x", "kind": "sft", "category": "single_turn", "messages": messages, "sources": [], "split": "train"}
    with pytest.raises(error, match=match):
        validate_sft_record(row)


def test_preference_example_from_a_minimal_rubric_row():
    from searchjax.data.sft import preference_example

    row = {"id": "r1", "messages": [{"role": "user", "content": "Plz fix"}], "reference": "Please fix.",
           "rubrics": [{"text": "English", "kind": "language", "params": {"lang": "en"}}]}
    example = preference_example(row, 5)
    validate_sft_record(example)
    assert example["category"] == "rubric" and example["split"] == "train"
    assert example["messages"][-1] == {"role": "assistant", "content": "Please fix."}


def test_nested_descriptions_and_substitution():
    from searchjax.data.sft import nested_descriptions, substitute

    q = "What is the event where the founder of the organisation founded in 2008 spoke?"
    assert nested_descriptions(q) == ["the organisation founded in 2008",
                                      "the founder of the organisation founded in 2008",
                                      "the event where the founder of the organisation founded in 2008 spoke"]
    assert substitute(q, "the founder of the organisation founded in 2008", "Krawov Fuvawiath") == \
        "What is the event where Krawov Fuvawiath spoke?"
    assert nested_descriptions("Tell me a joke.") is None


def test_rewrite_thoughts_state_the_question_left_at_every_hop(kb, backend):
    qa = list(QAGenerator(kb, SearchSolver(backend), SynthConfig(n=24, seed=5, augment_fraction=0.5)).generate())
    plain = {r["id"]: r for r in SFTBuilder(kb, backend, seed=0).build(qa)}
    builder = SFTBuilder(kb, backend, seed=0, thoughts="rewrite")
    rewrite = {r["id"]: r for r in builder.build(qa)}
    assert rewrite.keys() == plain.keys() and not builder.summary["rejected:no_rewrite"]
    qa_by_id = {r["id"]: r for r in qa}
    checked = 0
    for rid, r in rewrite.items():
        if r["category"] != "single_turn":
            continue
        record = qa_by_id[r["sources"][0]]
        calls = [m for m in r["messages"] if m.get("tool_calls")]
        old = [m for m in plain[rid]["messages"] if m.get("tool_calls")]
        # Same searches; the thought of hop k > 1 adds the question left, which names the entity hop k-1 found
        # (it is the next query's known side) and no longer holds the description hop k-1 resolved.
        assert [c["tool_calls"] for c in calls] == [c["tool_calls"] for c in old]
        assert calls[0]["reasoning_content"] == old[0]["reasoning_content"]
        for c, o in zip(calls[1:], old[1:]):
            left, _, rest = c["reasoning_content"].removeprefix("The question is now: ").partition(" I need ")
            assert "I need " + rest == o["reasoning_content"]
            assert len(left) < len(record["question"]) + 40 and left.split()[0] == record["question"].split()[0]
        final = r["messages"][-1]
        assert final["reasoning_content"].endswith(f"So the answer is {record['answer']}.")
        assert record["answer"] in final["reasoning_content"].removeprefix("The question is now: ").split(" So ")[0]
        assert final["content"] == plain[rid]["messages"][-1]["content"]
        checked += 1
    assert checked >= 3
    with pytest.raises(ValueError, match="thoughts must be one of"):
        SFTBuilder(kb, backend, thoughts="verbose")


def test_found_thoughts_state_what_each_search_found_before_the_question_left(kb, backend):
    qa = list(QAGenerator(kb, SearchSolver(backend), SynthConfig(n=24, seed=5, augment_fraction=0.5)).generate())
    rewrite = {r["id"]: r for r in SFTBuilder(kb, backend, seed=0, thoughts="rewrite").build(qa)}
    found = {r["id"]: r for r in SFTBuilder(kb, backend, seed=0, thoughts="found").build(qa)}
    assert found.keys() == rewrite.keys()
    answers = {r["id"]: r["answer"] for r in qa}
    hops = 0
    for rid, r in found.items():
        if r["category"] != "single_turn":
            continue
        turns = [m for m in r["messages"] if m["role"] in ("assistant", "tool")]
        old = [m for m in rewrite[rid]["messages"] if m["role"] == "assistant"]
        mine = [m for m in turns if m["role"] == "assistant"]
        assert [m.get("tool_calls") for m in mine] == [m.get("tool_calls") for m in old]
        assert mine[0]["reasoning_content"] == old[0]["reasoning_content"]
        for k in range(1, len(mine)):
            # "<the name the search before found> is <what it looked for>. " + the rewrite thought
            said, _, rest = mine[k]["reasoning_content"].partition(". The question is now: ")
            assert "The question is now: " + rest == old[k]["reasoning_content"]
            before = mine[k - 1]["reasoning_content"].rpartition("I need ")[2].removesuffix(", so I will search for it.")
            assert said.endswith(" is " + before)
            name = said.removesuffix(" is " + before)
            assert name in turns[turns.index(mine[k]) - 1]["content"]  # read from the results just shown
            if k < len(mine) - 1:
                assert name in mine[k]["tool_calls"][0]["function"]["arguments"]["query"]
            else:
                assert name == answers[r["sources"][0]]
                hops = max(hops, k)
    assert hops >= 2  # some question of several hops was checked


@pytest.mark.parametrize("share", [1.0, 0.5])
def test_recovery_examples_correct_a_broken_call_and_train_only_on_the_correction(kb, backend, qa_records, tokenizer,
                                                                               share):
    plain = list(SFTBuilder(kb, backend, seed=0, thoughts="found").build(qa_records))
    builder = SFTBuilder(kb, backend, seed=0, thoughts="found", recovery=share)
    mixed = list(builder.build(qa_records))
    assert [r["id"] for r in mixed] == [r["id"] for r in plain]  # recovery draws from a stream of its own
    recovered = 0
    for a, b in zip(plain, mixed):
        broken = [i for i, m in enumerate(b["messages"]) if m.get("weight") == 0]
        if not broken:
            assert b == a and (share < 1.0 or a["category"] == "multi_turn")  # multi_turn: no call after its last query
            continue
        (i,) = broken
        assert b["messages"][:i] + b["messages"][i + 2 :] == a["messages"]
        text = b["messages"][i]["reasoning_content"]
        parsed = parse_assistant(text, [SEARCH_WEB_TOOL])
        assert not parsed.tool_calls and parsed.errors[0].startswith("unclosed <think>")
        assert b["messages"][i + 1] == {"role": "tool", "content": rejection_response(parsed.errors)}
        thought = b["messages"][i + 2]["reasoning_content"]
        assert b["messages"][i + 2]["tool_calls"] and thought.startswith(text.split("\n")[0])
        ids, mask = encode_conversation(b["messages"], tokenizer, [SEARCH_WEB_TOOL])
        ids_a, mask_a = encode_conversation(a["messages"], tokenizer, [SEARCH_WEB_TOOL])
        np.testing.assert_array_equal(ids[mask == 1], ids_a[mask_a == 1])  # the same targets: none in the broken turn
        recovered += 1
    assert builder.summary["with_recovery"] == recovered
    assert 0 < recovered < len(mixed) if share < 1.0 else recovered > len(mixed) / 2
