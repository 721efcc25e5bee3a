"""searchjax.testing.scripted.ScriptedDriver through the real agent loop: stops like the real driver (stop id,
max_new_tokens, the cache), tool turns run the real search tool, log μ is the given constant; `by_turn` plays a
list of texts; `prompts` holds what each rollout was shown."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from searchjax.chat import render, train_tokenizer
from searchjax.data.prompts import prompt_messages
from searchjax.rollout import AgentConfig, PromptItem, SearchAgent
from searchjax.search import SEARCH_WEB_TOOL, MemoryBackend
from searchjax.testing.scripted import ScriptedDriver

DOCS = [{"title": "France", "url": "https://w.example/france", "text": "Paris is the capital of France."}]
CALL = ("Let me search.\n</think>\n\n<tool_call>\n<function=search_web>\n<parameter=query>\ncapital of France\n"
        "</parameter>\n</function>\n</tool_call>")
ANSWER = "Found it.\n</think>\n\nThe answer is Paris.<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    prompt = render(prompt_messages({"question": "What is the capital of France?"}, 2), tools=[SEARCH_WEB_TOOL])
    (root / "corpus.txt").write_text((prompt + CALL + ANSWER + DOCS[0]["text"] + "\n") * 20)
    return train_tokenizer([str(root / "corpus.txt")], 600, str(root / "tokenizer.json"))


def _item(budget=2):
    return PromptItem.from_record({"id": "q1", "question": "What is the capital of France?", "answer": "Paris"}, budget)


def _rollout(tokenizer, script, max_new=200, max_len=4096, logprob=0.0):
    driver = ScriptedDriver(tokenizer, script, max_len=max_len, logprob=logprob)
    agent = SearchAgent(driver, MemoryBackend(DOCS), AgentConfig(budget=2, max_new_tokens=max_new))
    (record,) = agent.rollouts([_item()], 1, jax.random.key(0))
    return record


def test_a_search_then_an_answer(tokenizer):
    record = _rollout(tokenizer, lambda rollout, turn: [CALL, ANSWER][turn], logprob=-0.5)
    assert (record.finish_reason, record.answer, record.tool_calls, record.tool_failures) == (
        "answer", "The answer is Paris.", 1, 0)
    assert record.turns[0]["tool_calls"][0]["arguments"] == {"query": "capital of France"}
    mask, logp = np.asarray(record.loss_mask), np.asarray(record.logprobs)
    assert set(logp[mask == 1]) == {-0.5} and set(logp[mask == 0]) == {0.0}
    record.check()


def test_a_text_without_a_stop_repeats_until_max_new_tokens_or_the_cache(tokenizer):
    record = _rollout(tokenizer, lambda rollout, turn: "on and on ", max_new=37)
    assert record.finish_reason == "max_tokens" and record.response_length == 37
    record = _rollout(tokenizer, lambda rollout, turn: "on and on ", max_new=500, max_len=record.prompt_length + 9)
    assert record.finish_reason == "context" and len(record.tokens) == record.prompt_length + 9


def test_an_empty_script_is_an_error(tokenizer):
    with pytest.raises(ValueError, match="no text for turn 0"):
        _rollout(tokenizer, lambda rollout, turn: "")


def test_by_turn_plays_its_last_text_on_and_prompts_are_what_each_rollout_was_shown(tokenizer):
    driver = ScriptedDriver.by_turn(tokenizer, [CALL])
    agent = SearchAgent(driver, MemoryBackend(DOCS), AgentConfig(budget=1, max_new_tokens=200))
    records = agent.rollouts([_item(budget=1)], 2, jax.random.key(0))
    # CALL at every turn: one search, a call past the budget (told), then one that ends the rollout.
    assert [(r.finish_reason, r.tool_calls, [t["text"] for t in r.turns]) for r in records] == [
        ("budget", 3, [CALL] * 3)] * 2
    assert driver.prompts == [tokenizer.decode(agent.prompt_ids(_item(budget=1)))] * 2
    for texts in ([], CALL):
        with pytest.raises(ValueError, match="non-empty sequence of texts"):
            ScriptedDriver.by_turn(tokenizer, texts)
