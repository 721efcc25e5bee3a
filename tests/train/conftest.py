"""Fixtures for the training tests: a small world, its SFT data, a tokenizer and a tiny HF checkpoint, built once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchjax.chat import train_tokenizer
from searchjax.data.jsonl import write_jsonl


@pytest.fixture(scope="session")
def workspace(tmp_path_factory) -> dict[str, Path]:
    """world/corpus.jsonl, index/, qa.jsonl, sft.jsonl (train + dev rows), tokenizer.json and a tiny model/."""
    import jax

    from searchjax.data.sft import SFTBuilder
    from searchjax.data.solvers import SearchSolver
    from searchjax.data.synth import QAGenerator, SynthConfig
    from searchjax.model import init_params, load_preset, save_hf
    from searchjax.search import TantivyBackend, build_index
    from searchjax.search.world import KnowledgeBase, build_world

    d = tmp_path_factory.mktemp("train_ws")
    build_world(d / "world", seed=0, n_docs=400, n_real_cities=20, progress=False)
    build_index(d / "world" / "corpus.jsonl", d / "index", progress=False)
    kb, backend = KnowledgeBase.load(d / "world"), TantivyBackend(d / "index")
    qa = list(QAGenerator(kb, SearchSolver(backend), SynthConfig(n=30, seed=0, augment_fraction=0.0,
                                                                  dev_fraction=0.2)).generate())
    write_jsonl(d / "qa.jsonl", qa)
    sft = list(SFTBuilder(kb, backend, seed=0, max_results=2).build(qa, n_abstention=4))
    write_jsonl(d / "sft.jsonl", sft)
    tok = train_tokenizer([d / "world" / "corpus.jsonl"], 1024, d / "tokenizer.json")
    cfg = load_preset("tiny").replace(vocab_size=tok.vocab_size)
    save_hf(d / "model", init_params(cfg, jax.random.key(0)), cfg)
    (d / "model" / "tokenizer.json").write_bytes((d / "tokenizer.json").read_bytes())
    return {"root": d, "corpus": d / "world" / "corpus.jsonl", "qa": d / "qa.jsonl", "sft": d / "sft.jsonl",
            "model": d / "model", "tokenizer": d / "tokenizer.json"}


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
