"""Shared fixtures for the data tests: a small BPE tokenizer trained once per session."""

from __future__ import annotations

import pytest

from searchjax.chat import train_tokenizer
from searchjax.data.prompts import SYSTEM_PROMPT
from searchjax.data.rubric_data import generate_rubric_records


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    lines = [SYSTEM_PROMPT, "Which book was written by the person who founded the accelerator?"]
    for r in generate_rubric_records(100, seed=0):
        lines += [r["messages"][-1]["content"], r["reference"]]
    corpus = d / "corpus.txt"
    corpus.write_text("\n".join(lines * 3))
    return train_tokenizer([str(corpus)], vocab_size=1200, out=d / "tokenizer.json")


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    """A small offline world (≈3,000 documents) with its tantivy index, built once per session."""
    from searchjax.search import build_index
    from searchjax.search.world import build_world

    d = tmp_path_factory.mktemp("world")
    build_world(d, seed=0, n_docs=3000, n_real_cities=50, progress=False)
    build_index(d / "corpus.jsonl", d / "index")
    return d


@pytest.fixture(scope="session")
def kb(world):
    from searchjax.search.world import KnowledgeBase

    return KnowledgeBase.load(world)


@pytest.fixture(scope="session")
def backend(world):
    from searchjax.search import TantivyBackend

    return TantivyBackend(world / "index")
