"""Fixtures for the training tests: a small world, its SFT data, a tokenizer and a tiny HF checkpoint, built once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchjax.data.jsonl import write_jsonl


@pytest.fixture(scope="session")
def workspace(tmp_path_factory) -> dict[str, Path]:
    """world/corpus.jsonl, index/, qa.jsonl (30 questions, a 0.2 dev split), sft.jsonl (train + dev rows),
    tokenizer.json and a tiny model/ (searchjax.testing.workspace's pieces)."""
    import jax

    from searchjax.data.sft import SFTBuilder
    from searchjax.search import TantivyBackend
    from searchjax.search.world import KnowledgeBase
    from searchjax.testing.workspace import tiny_data, tiny_policy

    d = tmp_path_factory.mktemp("train_ws")
    qa = tiny_data(d, seed=0, docs=400, questions=30, dev_fraction=0.2, vocab_size=1024)
    sft = SFTBuilder(KnowledgeBase.load(d / "world"), TantivyBackend(d / "index"), seed=0, max_results=2)
    write_jsonl(d / "sft.jsonl", list(sft.build(qa, n_abstention=4)))
    tiny_policy(d / "model", d / "tokenizer.json", jax.random.key(0))
    return {"root": d, "corpus": d / "world" / "corpus.jsonl", "qa": d / "qa.jsonl", "sft": d / "sft.jsonl",
            "model": d / "model", "tokenizer": d / "tokenizer.json"}


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
