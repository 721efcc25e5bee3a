"""Fixtures for the evaluation tests: a small world with its index and multilingual / unanswerable questions, a
tokenizer trained on its corpus, a tiny random policy saved in HF format, and `ScriptedDriver`, a test double
for the rollout driver that plays given assistant texts with the real tokenizer (the agent, the parser, the
search tool and the harness stay real)."""

from __future__ import annotations

import json
import types

import jax
import numpy as np
import pytest

from searchjax.rollout.driver import Completion


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
    import shutil

    from searchjax.model import init_params, load_preset, save_hf

    d = tmp_path_factory.mktemp("model")
    cfg = load_preset("tiny").replace(vocab_size=tokenizer.vocab_size)
    save_hf(d, init_params(cfg, jax.random.key(0)), cfg)
    shutil.copyfile(world / "tokenizer.json", d / "tokenizer.json")
    return d


class ScriptedDriver:
    """Plays `script[turn]` for every rollout and stops like the real driver (stop ids, then max_new_tokens); a
    text without a stop token is repeated until max_new_tokens."""

    def __init__(self, tokenizer, script, max_len=4096):
        self.tokenizer, self.script = tokenizer, script
        self.engine = types.SimpleNamespace(max_len=max_len)
        self.params, self.version = None, 0
        self.prompts: list[str] = []

    def run(self, requests, on_finish=None):
        pending, done = list(requests), []
        while pending:
            r = pending.pop(0)
            if r.tag.turns == 0:
                self.prompts.append(self.tokenizer.decode(r.prompt))
            ids = self.tokenizer.encode(self.script[min(r.tag.turns, len(self.script) - 1)])
            while len(ids) < r.max_new_tokens and not set(ids) & set(r.stop_token_ids):
                ids = ids + ids  # a text without a stop token: a model that never stops
            stop = next((k for k, t in enumerate(ids) if t in r.stop_token_ids), None)
            if stop is not None and stop < r.max_new_tokens:
                ids, reason, token = ids[: stop + 1], "stop_token", ids[stop]
            else:
                ids, reason, token = ids[: r.max_new_tokens], "max_tokens", None
            c = Completion(r, np.asarray(ids, np.int32), np.zeros(len(ids), np.float32), reason, token, 0.0, 0.0)
            done.append(c)
            pending += list(on_finish(c) or ()) if on_finish else []
        return done


@pytest.fixture(scope="session")
def scripted_driver():
    return ScriptedDriver
