"""Shared fixtures for rollout tests: a tokenizer trained here, the tiny preset at its vocab size, and engines.

Engines are module-independent session fixtures because each one compiles its own kernels (the slow part on CPU).
`scripted_params` edits a random tiny model into a near-deterministic Markov chain over chosen tokens, so a test
can make the real engine emit a known sequence (e.g. a stop token in the middle of a generation).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from searchjax import model as M
from searchjax.chat import render, render_tool_call, train_tokenizer
from searchjax.data.prompts import prompt_messages
from searchjax.search import SEARCH_WEB_TOOL
from searchjax.rollout import Sampling, SearchJaxEngine

CORPUS = (
    "The river Avon flows through the city of Bath. Paris is the capital of France.\n"
    "Search the web for the answer, then answer briefly with the name of the city or river.\n"
    + render_tool_call("search_web", {"query": "capital of France"}) + "\n"
    "Search results for the query: [1] Paris - the capital and largest city of France.\n"
)


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    corpus = root / "corpus.txt"
    # The agent's rendered prompt is in the corpus so that it compresses to a few hundred tokens.
    prompt = render(prompt_messages({"question": "Which river?"}, 2), tools=[SEARCH_WEB_TOOL])
    corpus.write_text((CORPUS + prompt) * 20)
    return train_tokenizer([str(corpus)], 800, str(root / "tokenizer.json"))


@pytest.fixture(scope="session")
def cfg(tokenizer):
    return M.load_preset("tiny").replace(vocab_size=tokenizer.vocab_size)


@pytest.fixture(scope="session")
def params(cfg):
    return M.init_params(cfg, jax.random.key(0))


@pytest.fixture(scope="session")
def engine(cfg, params, tokenizer):
    """4 slots, prefill chunks of 64, 1024 positions; greedy by default (JetStream's orchestrator uses it)."""
    return SearchJaxEngine(
        cfg, params, tokenizer, max_concurrent_decodes=4, max_prefill_length=64, max_len=1024,
        sampling=Sampling(temperature=0.0),
    )


@pytest.fixture(scope="session")
def scripted():
    """The `scripted_params` function (fixtures are how test modules here share helpers)."""
    return scripted_params


def scripted_params(params, transitions: dict[int, int], scale: float = 6.0):
    """Params whose next token after u is (almost surely) transitions[u].

    Token u's embedding becomes scale·e_k (a basis direction of its own) and the unembedding row of
    transitions[u] gets scale·e_k: the current token dominates the residual stream of a 0.02-init model.
    """
    embed, head = params.embed, params.lm_head
    d = embed.shape[1]
    if len(transitions) > d:
        raise ValueError(f"at most {d} transitions, got {len(transitions)}")
    for k, (u, v) in enumerate(transitions.items()):
        basis = jnp.zeros((d,), embed.dtype).at[k].set(scale)
        embed = embed.at[u].set(basis)
        head = head.at[v].add(basis)
    return params.replace(embed=embed, lm_head=head)
