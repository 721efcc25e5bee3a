"""Preference data (searchjax.data.preferences): every category from a real world, both orders, the judges and the
k-of-n agreement filter, TRL-shaped loading with file:line errors, the tokenisation of x‖a, the config."""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import pytest

from searchjax.chat import render
from searchjax.config import ConfigError, configs_dir, load_yaml
from searchjax.data.jsonl import DataError, write_jsonl
from searchjax.data.preferences import (
    CATEGORIES,
    LLMPairJudge,
    PreferenceBuilder,
    PreferenceConfig,
    RubricJudge,
    RuleJudge,
    agreement_keep,
    encode_prompt_response,
    final_text,
    judge_and_filter,
    kept_share,
    read_preferences,
)
from searchjax.data.rubric_data import generate_rubric_records
from searchjax.data.solvers import SearchSolver
from searchjax.data.synth import QAGenerator, SynthConfig


@pytest.fixture(scope="module")
def built(kb, backend):
    qa = list(QAGenerator(kb, SearchSolver(backend), SynthConfig(n=40, seed=3, max_hops=3,
                                                                  augment_fraction=0.3)).generate())
    rubric = generate_rubric_records(36, seed=1)
    cfg = PreferenceConfig(pairs_per_category=24, seed=0)
    builder = PreferenceBuilder(kb, backend, cfg)
    pairs = list(builder.build(qa, rubric))
    kept, report = judge_and_filter(pairs, [RuleJudge(), RubricJudge()], cfg.min_agree)
    return pairs, kept, report, qa


def test_every_category_is_built_with_distinct_responses(built):
    pairs, _, _, _ = built
    counts = Counter(p["category"] for p in pairs)
    assert set(counts) == set(CATEGORIES) and min(counts.values()) >= 10, counts
    for p in pairs:
        assert p["chosen"] != p["rejected"] and final_text(p["chosen"]) != final_text(p["rejected"])
        render([*p["prompt"], *p["chosen"]], add_generation_prompt=False)
        render([*p["prompt"], *p["rejected"]], add_generation_prompt=False)
    ids = [p["id"] for p in pairs]
    assert len(set(ids)) == len(ids)


def test_pairs_differ_where_their_category_says(built):
    pairs, _, _, qa = built
    answers = {r["id"]: r["answer"] for r in qa}
    for p in pairs:
        c, r = final_text(p["chosen"]), final_text(p["rejected"])
        tools = [m for m in p["prompt"] if m["role"] == "tool"]
        searched = ("correctness", "grounded", "refusal", "abstention")
        if p["category"] in searched and not p["source"].startswith("rubric"):
            assert tools, p["category"]  # judged against the search results in the context
        if p["category"] == "concise":
            assert c in r and len(r.split()) > len(c.split()) + 10
        if p["category"] == "correctness":  # same wording, another entity in the answer's place
            answer = answers[p["source"]]
            assert answer in c and answer not in r and c.count("\n") == r.count("\n"), (c, r)
            assert c.split(answer)[0] == r[: len(c.split(answer)[0])]


def test_wrong_answers_are_other_questions_answers(built):
    """Within the category a name is about as often the wrong answer as the right one: only the context (the
    search results) tells them apart, never a prior over names."""
    pairs, _, _, qa = built
    answers = {r["answer"] for r in qa}
    said = lambda turns: re.fullmatch(r"The answer is (.+)\.", final_text(turns))  # noqa: E731
    chosen, rejected = Counter(), Counter()
    for p in pairs:
        if p["category"] == "correctness" and said(p["chosen"]) and said(p["rejected"]):
            chosen[said(p["chosen"]).group(1)] += 1
            rejected[said(p["rejected"]).group(1)] += 1
    assert sum(rejected.values()) >= 5 and set(rejected) <= answers
    imbalance = sum(abs(chosen[n] - rejected[n]) for n in set(chosen) | set(rejected))
    assert imbalance <= 0.5 * sum(chosen.values()), (chosen, rejected)


def test_no_group_is_in_both_splits(built):
    pairs, _, _, _ = built
    by_source = {}
    for p in pairs:
        if p["source"]:
            by_source.setdefault((p["category"], p["source"]), set()).add(p["split"])
    assert all(len(s) == 1 for s in by_source.values())
    assert {p["split"] for p in pairs} == {"train", "dev"}


def test_judges_agree_on_most_pairs_and_the_report_counts_them(built):
    pairs, kept, report, _ = built
    cats = report["categories"]
    assert set(cats) == set(CATEGORIES)
    for c, row in cats.items():
        assert row["built"] == sum(p["category"] == c for p in pairs)
        assert row["kept_share"] >= 0.6, (c, row)
    assert sum(r["kept"] for r in cats.values()) == len(kept)
    assert all(sum(v == 1 for v in r["votes"].values()) >= 2 for r in kept)
    assert all("rubrics" not in r for r in kept)


def test_rule_judge_catches_a_swapped_pair(built):
    """The judges are real checks: with chosen and rejected exchanged, they vote against."""
    pairs, _, _, _ = built
    flipped = [{**p, "chosen": p["rejected"], "rejected": p["chosen"]} for p in pairs]
    votes = np.array([[RuleJudge()(p), RubricJudge()(p)] for p in flipped])
    assert (votes == -1).all(axis=1).mean() > 0.6


def test_agreement_filter_on_hand_made_votes():
    votes = np.array([[1, 1, 1], [1, 1, 0], [1, 0, -1], [-1, -1, 1], [0, 0, 0], [1, -1, 1]])
    np.testing.assert_array_equal(agreement_keep(votes, 2), [True, True, False, False, False, True])
    np.testing.assert_array_equal(agreement_keep(votes, 3), [True, False, False, False, False, False])
    np.testing.assert_array_equal(agreement_keep(votes, 1), [True, True, True, True, False, True])
    share = kept_share(["a", "a", "b", "b", "b", "a"], agreement_keep(votes, 2))
    assert share == {"a": {"built": 3, "kept": 3, "kept_share": 1.0},
                     "b": {"built": 3, "kept": 0, "kept_share": 0.0}}
    with pytest.raises(ValueError, match="k must be in"):
        agreement_keep(votes, 4)
    with pytest.raises(ValueError, match="votes must be"):
        agreement_keep(np.array([[2, 1]]), 1)


def test_llm_judge_hides_the_label_order_and_reads_its_vote():
    pair = {"id": "p-1", "prompt": [{"role": "user", "content": "2+2?"}],
            "chosen": [{"role": "assistant", "content": "4"}], "rejected": [{"role": "assistant", "content": "5"}]}
    seen = []

    def client(messages):  # a judge that always prefers the answer "4", wherever it is shown
        seen.append(messages[-1]["content"])
        return json.dumps({"better": "A" if "RESPONSE A:\n4" in seen[-1] else "B"})

    judge = LLMPairJudge(client)
    assert [judge({**pair, "id": f"p-{i}"}) for i in range(6)] == [1] * 6
    assert {"RESPONSE A:\n4" in s for s in seen} == {True, False}  # the chosen one is shown first and second
    assert LLMPairJudge(lambda m: "no json here")(pair) == 0


def test_written_pairs_load_back_in_trl_shapes(built, tmp_path):
    _, kept, _, _ = built
    write_jsonl(tmp_path / "prefs.jsonl", kept)
    rows, summary = read_preferences(tmp_path / "prefs.jsonl")
    assert summary.kept == len(kept)
    assert [(r["prompt"], r["chosen"], r["rejected"], r["category"]) for r in rows] == \
        [(r["prompt"], r["chosen"], r["rejected"], r["category"]) for r in kept]


def test_standard_and_implicit_prompt_shapes(tmp_path):
    user = {"role": "user", "content": "Which is the capital of France?"}
    rows = [
        {"prompt": "Which is the capital of France?", "chosen": "Paris.", "rejected": "Lyon."},
        {"chosen": [user, {"role": "assistant", "content": "Paris."}],
         "rejected": [user, {"role": "assistant", "content": "Lyon."}]},
    ]
    write_jsonl(tmp_path / "p.jsonl", rows)
    got, _ = read_preferences(tmp_path / "p.jsonl")
    for r in got:
        assert r["prompt"] == [user] and r["chosen"] == [{"role": "assistant", "content": "Paris."}]
        assert r["category"] == "user" and r["split"] == "train"
    assert [r["id"] for r in got] == ["p.jsonl#1", "p.jsonl#2"]


BAD_ROWS = [
    ({"prompt": "q", "chosen": "a"}, "missing field 'rejected'"),
    ({"prompt": "q", "chosen": "a", "rejected": "a"}, "same response"),
    ({"prompt": "q", "chosen": 3, "rejected": "b"}, "field 'chosen'"),
    ({"prompt": [{"role": "assistant", "content": "hi"}], "chosen": "a", "rejected": "b"}, "needs a user turn"),
    ({"prompt": "q", "chosen": [{"role": "bot", "content": "a"}], "rejected": "b"}, "role in"),
    ({"prompt": "q", "chosen": [{"role": "system", "content": "x"}, {"role": "assistant", "content": "a"}],
      "rejected": "b"}, "no system turn"),
    ({"prompt": "q", "chosen": "a", "rejected": "b", "split": "test"}, "field 'split'"),
]


@pytest.mark.parametrize("row,reason", BAD_ROWS, ids=[r for _, r in BAD_ROWS])
def test_a_bad_row_names_file_and_line(tmp_path, row, reason):
    path = tmp_path / "prefs.jsonl"
    good = {"prompt": "q", "chosen": "a", "rejected": "b"}
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=rf"^{path}:3: .*{reason}"):
        read_preferences(path)
    rows, summary = read_preferences(path, on_error="skip")
    assert len(rows) == 1 and len(summary.skipped) == 1 and summary.skipped[0].startswith(f"{path}:3:")


def test_invalid_json_names_the_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "q", "chosen": "a", "rejected": "b"}\n{"prompt": \n')
    with pytest.raises(DataError, match=rf"^{path}:2: invalid JSON"):
        read_preferences(path)


def test_prompt_and_response_tokens_are_the_rendered_conversation(tokenizer, built):
    pairs, _, _, _ = built
    for p in pairs[:: max(1, len(pairs) // 12)]:
        x, (a, b) = encode_prompt_response(tokenizer.encode, p["prompt"], [p["chosen"], p["rejected"]])
        assert x + a == tokenizer.encode(render([*p["prompt"], *p["chosen"]], add_generation_prompt=False))
        assert x + b == tokenizer.encode(render([*p["prompt"], *p["rejected"]], add_generation_prompt=False))


def test_shipped_config_loads_and_bad_values_name_the_file(tmp_path):
    cfg = load_yaml(PreferenceConfig, configs_dir() / "data" / "preferences.yaml")
    assert cfg == PreferenceConfig()
    bad = tmp_path / "p.yaml"
    bad.write_text("judges: [rules]\nmin_agree: 2\n")
    with pytest.raises(ConfigError, match=rf"{bad}: .*min_agree"):
        load_yaml(PreferenceConfig, bad)
    bad.write_text("categories: [tone]\n")
    with pytest.raises(ConfigError, match="categories"):
        load_yaml(PreferenceConfig, bad)


def test_cli_writes_filtered_pairs_and_reports_the_kept_share(world, built, tmp_path, capsys):
    from searchjax.cli.main import main

    _, _, _, qa = built
    write_jsonl(tmp_path / "qa.jsonl", qa)
    write_jsonl(tmp_path / "rubric.jsonl", generate_rubric_records(12, seed=4))
    args = ["data", "preferences", "--world", str(world), "--qa", str(tmp_path / "qa.jsonl"), "--rubric",
            str(tmp_path / "rubric.jsonl"), "--out", str(tmp_path / "prefs.jsonl"), "--pairs-per-category", "6"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().err)
    assert set(report["categories"]) == set(CATEGORIES) and report["min_agree"] == 2
    rows, _ = read_preferences(tmp_path / "prefs.jsonl")
    assert len(rows) == report["written"] == sum(c["kept"] for c in report["categories"].values())
    assert main(args) == 1 and "exists" in capsys.readouterr().err  # never clobbered without --overwrite
    # --results sets the search results per call shown in the pairs' trajectories (the config's max_results).
    assert main([*args, "--overwrite", "--results", "1"]) == 0
    capsys.readouterr()
    one, _ = read_preferences(tmp_path / "prefs.jsonl")
    shown = [m["content"].count("\nURL: ") for r in one for m in r["prompt"] if m["role"] == "tool"]
    assert shown and max(shown) == 1
    (tmp_path / "llm.yaml").write_text("judges: [rules, llm]\nmin_agree: 2\n")
    assert main([*args, "--overwrite", "--config", str(tmp_path / "llm.yaml")]) == 1
    assert "no --judge-url" in capsys.readouterr().err


def test_rewrite_thoughts_keep_the_chain_and_swap_the_answer(kb, backend, built):
    _, _, _, qa = built
    plain = {p["source"]: p for p in built[0] if p["category"] == "format" and p["source"] in {r["id"] for r in qa}}
    cfg = PreferenceConfig(pairs_per_category=24, seed=0, categories=("correctness", "format"), thoughts="rewrite")
    pairs = list(PreferenceBuilder(kb, backend, cfg).build(qa, []))
    fmt = {p["source"]: p for p in pairs if p["category"] == "format"}
    # The format pairs list the same chain whatever the thinking style (it comes from the expert's trace).
    assert fmt and all(fmt[s]["chosen"] == plain[s]["chosen"] for s in fmt.keys() & plain.keys())
    for p in (p for p in pairs if p["category"] == "correctness"):
        chosen, rejected = p["chosen"][0], p["rejected"][0]
        assert chosen["reasoning_content"].startswith("The question is now: ")
        assert "So the answer is " in chosen["reasoning_content"] and chosen != rejected
    with pytest.raises(TypeError, match="PreferenceConfig.thoughts"):
        PreferenceConfig(thoughts="loud")
