"""Fixtures for the evaluation tests: a small world with its index and multilingual / unanswerable questions, a
tokenizer trained on its corpus, a tiny random policy saved in HF format, and `searchjax.testing.scripted`'s
`ScriptedDriver`, a test double for the rollout driver that plays given assistant texts with the real tokenizer
(the agent, the parser, the search tool and the harness stay real)."""

from __future__ import annotations

import json

import jax
import pytest

from searchjax.testing.scripted import ScriptedDriver


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    """≈800 documents, their tantivy index, and 3 verified questions in en/sv/ja plus unanswerable copies."""
    from searchjax.data.solvers import SearchSolver
    from searchjax.data.synth import QAGenerator, SynthConfig
    from searchjax.search import TantivyBackend, build_index
    from searchjax.search.world import KnowledgeBase, build_world

    d = tmp_path_factory.mktemp("world")
    build_world(d, seed=0, n_docs=800, n_real_cities=20, progress=False)
    build_index(d / "corpus.jsonl", d / "index")
    cfg = SynthConfig(n=3, seed=1, augment_fraction=0.0, languages=("en", "sv", "ja"), unanswerable_fraction=1.0)
    gen = QAGenerator(KnowledgeBase.load(d), SearchSolver(TantivyBackend(d / "index")), cfg)
    rows = list(gen.generate())
    (d / "qa.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return d


@pytest.fixture(scope="session")
def tokenizer(world):
    from searchjax.chat import train_tokenizer

    return train_tokenizer([world / "corpus.jsonl"], 1024, world / "tokenizer.json")


@pytest.fixture(scope="session")
def model_dir(world, tokenizer, tmp_path_factory):
    """The tiny preset, random weights, saved with its tokenizer (what `searchjax eval --model` reads)."""
    from searchjax.testing.workspace import tiny_policy

    return tiny_policy(tmp_path_factory.mktemp("model"), world / "tokenizer.json", jax.random.key(0))


@pytest.fixture(scope="session")
def scripted_driver():
    """`scripted_driver(tokenizer, texts)`: the package's `ScriptedDriver` playing texts[turn] (the last one on)."""
    return ScriptedDriver.by_turn
