"""Public QA loaders: one fixture per published format, unified records, clear file:line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchjax.data.jsonl import DataError
from searchjax.data.public import FORMATS, load_public_qa, quality_filter

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "public"
FILES = {
    "simpleqa": ("simple_qa_test_set.csv", 3), "frames": ("frames_test.tsv", 2), "bamboogle": ("bamboogle.csv", 2),
    "sealqa": ("seal-0.parquet", 2), "webwalkerqa": ("webwalkerqa.jsonl", 2), "deepdive": ("deepdive_qa_rl.parquet", 2),
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_loads_into_unified_records(fmt):
    name, n = FILES[fmt]
    records, summary = load_public_qa(fmt, FIX / name, split="test")
    assert len(records) == n == summary.kept and not summary.skipped
    for r in records:
        assert set(r) == {"id", "kind", "question", "answer", "aliases", "source", "split", "meta"}
        assert r["kind"] == "qa" and r["source"] == fmt and r["split"] == "test"
        assert r["question"] and r["answer"] and r["question"] == r["question"].strip()


def test_format_specific_fields():
    simple, _ = load_public_qa("simpleqa", FIX / FILES["simpleqa"][0])
    assert simple[1]["question"].startswith("In which town, founded on a river delta")
    assert simple[0]["meta"]["answer_type"] == "Person" and len(simple[0]["meta"]["urls"]) == 2
    frames, _ = load_public_qa("frames", FIX / FILES["frames"][0])
    assert frames[1]["answer"] == "37" and frames[0]["meta"]["wiki_links"][1].endswith("/B")
    walker, _ = load_public_qa("webwalkerqa", FIX / FILES["webwalkerqa"][0])
    assert walker[0]["meta"]["Hop"] == "multi-source" and walker[0]["meta"]["root_url"].startswith("https://")
    seal, _ = load_public_qa("sealqa", FIX / FILES["sealqa"][0])
    assert seal[0]["meta"]["topic"] == "Transport"


def test_missing_file_and_columns(tmp_path):
    with pytest.raises(DataError, match=r"nope\.csv: no such file"):
        load_public_qa("simpleqa", tmp_path / "nope.csv")
    bad = tmp_path / "b.csv"
    bad.write_text("Question,Reply\nq,a\n")
    with pytest.raises(DataError, match=r"b\.csv:1: missing column\(s\) \['Answer'\]"):
        load_public_qa("bamboogle", bad)
    with pytest.raises(ValueError, match="unknown public QA format 'trivia'"):
        load_public_qa("trivia", bad)


def test_corrupt_rows_name_file_and_line(tmp_path):
    src = (FIX / FILES["simpleqa"][0]).read_text().splitlines()
    src.insert(2, '"{\'topic\': broken",Who?,X')  # becomes line 3
    bad = tmp_path / "simple.csv"
    bad.write_text("\n".join(src) + "\n")
    with pytest.raises(DataError, match=r"simple\.csv:3: column 'metadata': not a Python literal dict"):
        load_public_qa("simpleqa", bad)
    records, summary = load_public_qa("simpleqa", bad, on_error="skip")
    assert len(records) == 3 and len(summary.skipped) == 1 and ":3:" in summary.skipped[0]

    tsv = tmp_path / "frames.tsv"
    tsv.write_text("Prompt\tAnswer\twiki_links\nq1\ta1\t[]\nq2 only\n")
    with pytest.raises(DataError, match=r"frames\.tsv:3: expected 3 tab/comma-separated fields"):
        load_public_qa("frames", tsv)

    walker = tmp_path / "w.jsonl"
    walker.write_text('{"Question": "q", "Answer": "a"}\n{"Question": "q2"\n')
    with pytest.raises(DataError, match=r"w\.jsonl:2: invalid JSON"):
        load_public_qa("webwalkerqa", walker)

    parquet = tmp_path / "seal.parquet"
    parquet.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataError, match=r"seal\.parquet: not a readable Parquet file"):
        load_public_qa("sealqa", parquet)


def test_quality_filter_counts_reasons():
    base = {"kind": "qa", "aliases": [], "source": "x", "split": "train", "meta": {}}
    recs = [
        {**base, "id": "1", "question": "Who wrote Salt Ledgers?", "answer": "Ana Berg"},
        {**base, "id": "2", "question": "Who wrote  salt ledgers ?", "answer": "Ana Berg"},
        {**base, "id": "3", "question": "Is Ana Berg the author of Salt Ledgers?", "answer": "Ana Berg"},
        {**base, "id": "4", "question": "Explain the tides.", "answer": " ".join(["word"] * 30)},
        {**base, "id": "5", "question": "   ", "answer": "x"},
    ]
    kept, rejected = quality_filter(recs)
    assert [r["id"] for r in kept] == ["1"]
    assert rejected == {"duplicate": 1, "answer_in_question": 1, "answer_too_long": 1, "empty": 1}


def test_public_records_share_the_prompt_format(tmp_path, tokenizer):
    from searchjax.chat import render
    from searchjax.data.jsonl import write_jsonl
    from searchjax.data.pipeline import PipelineConfig, SourceConfig, build_dataset
    from searchjax.data.prompts import prompt_messages
    from searchjax.search import SEARCH_WEB_TOOL

    records, _ = load_public_qa("simpleqa", FIX / FILES["simpleqa"][0])
    write_jsonl(tmp_path / "simpleqa.jsonl", records)
    cfg = PipelineConfig(sources=(SourceConfig("simpleqa", str(tmp_path / "simpleqa.jsonl"), "qa", 1.0),),
                         batch_size=3, max_len=2048)
    batch = build_dataset(cfg, tokenizer, process_index=0, process_count=1)[0]
    for row, n, rec in zip(batch["input_ids"], batch["lengths"], batch["records"]):
        messages = prompt_messages(rec, cfg.tool_budget)
        assert messages[-1] == {"role": "user", "content": rec["question"]}
        assert tokenizer.decode(row[:n].tolist()) == render(messages, [SEARCH_WEB_TOOL], add_generation_prompt=True)


@pytest.mark.parametrize("fmt, name, content, message", [
    ("simpleqa", "bin.csv", b"metadata,problem,answer\n\"{}\",Q,\xff\xfe\n", "not UTF-8 text at or after line"),
    ("frames", "huge.tsv", b"Prompt\tAnswer\nQ\t" + b"A" * 200_000 + b"\n", "malformed TSV"),  # > csv field limit
    ("webwalkerqa", "bin.json", b"[\xff]", "not UTF-8 text"),
])
def test_undecodable_files_are_data_errors(tmp_path, fmt, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError, match=message):
        load_public_qa(fmt, path)


def test_a_directory_is_not_a_file(tmp_path):
    with pytest.raises(DataError, match="is a directory"):
        load_public_qa("frames", tmp_path)
