"""Shared fixtures: one small world and its tantivy index per test session."""

from __future__ import annotations

import pytest

from searchjax.search import KnowledgeBase, TantivyBackend, build_index, build_world


@pytest.fixture(scope="session")
def world_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    build_world(out, seed=7, n_docs=6000, n_real_cities=100, progress=False)
    return out


@pytest.fixture(scope="session")
def kb(world_dir):
    return KnowledgeBase.load(world_dir)


@pytest.fixture(scope="session")
def index_dir(world_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("index") / "idx"
    build_index(world_dir / "corpus.jsonl", out, progress=False)
    return out


@pytest.fixture(scope="session")
def tantivy_backend(index_dir):
    return TantivyBackend(index_dir)
