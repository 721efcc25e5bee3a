"""The search agent: record schema, tool turns, budgets, malformed and never-stopping models, groups, reference.

Most agent logic is driven by `searchjax.testing.scripted.ScriptedDriver`, a test double that plays given
assistant texts token by token with the real tokenizer (so the harness, the parser, the template and the search
tool are all real). The groups / reference / μ_infer tests use the real engine.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax import model as M
from searchjax.chat import render
from searchjax.rollout import (
    AgentConfig, PromptItem, RolloutDriver, Sampling, SearchAgent, read_jsonl, run_rollouts, to_arrays, write_jsonl,
)
from searchjax.rollout.agent import TOOLS
from searchjax.rollout.sampling import SamplingArrays, sampling_logprobs
from searchjax.search import MemoryBackend
from searchjax.testing.scripted import ScriptedDriver

DOCS = [
    {"title": "France", "url": "https://w.example/france", "text": "Paris is the capital of France."},
    {"title": "Bath", "url": "https://w.example/bath", "text": "The river Avon flows through Bath."},
]
CALL = "I should search.\n</think>\n\n<tool_call>\n<function=search_web>\n<parameter=query>\ncapital of France\n</parameter>\n</function>\n</tool_call>"
ANSWER = "Found it.\n</think>\n\nParis<|im_end|>"
LOGP = -0.25


class CountingBackend(MemoryBackend):
    def __init__(self, docs):
        super().__init__(docs)
        self.queries = []

    def search(self, query, k=10):
        self.queries.append(query)
        return super().search(query, k)


def _scripted(tokenizer, texts, max_len=4096):
    """The package's `ScriptedDriver` playing texts[turn] (the last one on), log μ = LOGP."""
    return ScriptedDriver.by_turn(tokenizer, texts, max_len=max_len, logprob=LOGP)


def _item(question="What is the capital of France?", budget=2):
    return PromptItem.from_record({"id": "q1", "question": question, "answer": "Paris"}, budget)


def _run(tokenizer, script, budget=2, max_new=200, backend=None, driver=None):
    backend = backend or CountingBackend(DOCS)
    agent = SearchAgent(driver or _scripted(tokenizer, script), backend, AgentConfig(budget, max_new))
    records = run_rollouts(agent, [_item(budget=budget)], 1, jax.random.key(0))
    assert len(records) == 1
    records[0].check()
    return records[0], backend, agent


def _policy_spans(record):
    """The token runs where loss_mask is 1."""
    spans, start = [], None
    for t, m in enumerate(record.loss_mask + [0]):
        if m and start is None:
            start = t
        if not m and start is not None:
            spans.append(record.tokens[start:t])
            start = None
    return spans


def test_search_then_answer_gives_the_rendered_conversation(tokenizer):
    record, backend, agent = _run(tokenizer, [CALL, ANSWER])
    assert backend.queries == ["capital of France"]
    assert (record.tool_calls, record.tool_failures, record.finish_reason, record.answer) == (1, 0, "answer", "Paris")
    # Token-in/token-out: the policy spans are exactly the sampled ids of each turn.
    assert _policy_spans(record) == [tokenizer.encode(CALL), tokenizer.encode(ANSWER)]
    assert record.response_length == len(tokenizer.encode(CALL)) + len(tokenizer.encode(ANSWER))
    assert all((lp == LOGP) == bool(m) for lp, m in zip(record.logprobs, record.loss_mask))
    # The whole sequence is the chat template's rendering of the conversation (tool response included).
    result = agent.tokenizer.decode(record.tokens[record.prompt_length :])
    messages = list(_item().messages) + [
        {"role": "assistant", "reasoning_content": "I should search.", "content": "",
         "tool_calls": [{"name": "search_web", "arguments": {"query": "capital of France"}}]},
        {"role": "tool", "content": result.split("<tool_response>\n")[1].split("\n</tool_response>")[0]},
        {"role": "assistant", "reasoning_content": "Found it.", "content": "Paris"},
    ]
    assert tokenizer.decode(record.tokens) == render(messages, tools=list(TOOLS), add_generation_prompt=False).rstrip("\n")
    assert "Paris is the capital of France." in result


def test_loss_mask_never_covers_tool_response_tokens(tokenizer):
    record, _, _ = _run(tokenizer, [CALL, CALL, ANSWER], budget=3)
    s = tokenizer.special
    inside = False
    for t, m in zip(record.tokens, record.loss_mask):
        inside = (inside or t == s.tool_response) and t != s.tool_response_end
        assert not (inside and m), "a tool-response token is in the loss mask"
    assert record.tokens.count(s.tool_response) == 2 and record.loss_mask[: record.prompt_length] == [0] * record.prompt_length


def test_budget_zero_executes_no_search(tokenizer):
    record, backend, _ = _run(tokenizer, [CALL, ANSWER], budget=0)
    assert backend.queries == []
    assert (record.tool_calls, record.tool_failures, record.finish_reason) == (1, 1, "answer")
    assert "budget" in tokenizer.decode(record.tokens[record.prompt_length :])


def test_calling_again_past_the_budget_ends_the_rollout(tokenizer):
    record, backend, _ = _run(tokenizer, [CALL], budget=1)
    assert len(backend.queries) == 1
    assert (record.tool_calls, record.tool_failures, record.finish_reason) == (3, 2, "budget")


BAD = "</think>\n\n<tool_call>garbage</tool_call>"


def test_rejected_calls_consume_no_budget_and_the_valid_search_is_seen(tokenizer):
    """Budget 1, turns [malformed, malformed, valid]: the search runs and its result is in the next turn's context."""
    record, backend, _ = _run(tokenizer, [BAD, BAD, CALL, ANSWER], budget=1, max_new=400)
    assert backend.queries == ["capital of France"]
    assert (record.tool_calls, record.tool_failures, record.finish_reason, record.answer) == (3, 2, "answer", "Paris")
    text = tokenizer.decode(record.tokens[record.prompt_length :])
    assert text.index("Paris is the capital of France.") < text.rindex("Found it.")
    # Calling on: the 4th call is refused (past the budget, no search), the 5th ends the rollout; both count.
    record, backend, _ = _run(tokenizer, [BAD, BAD, CALL], budget=1, max_new=400)
    assert backend.queries == ["capital of France"]
    assert (record.tool_calls, record.tool_failures, record.finish_reason) == (5, 4, "budget")
    text = tokenizer.decode(record.tokens)
    assert "Paris is the capital of France." in text and "used up" in text


def test_sft_recovery_data_shows_the_agents_response_to_its_broken_call(tokenizer):
    """The broken turn of an SFT recovery example, played to the agent, gets the very response the example shows."""
    import random

    from searchjax.data.sft import with_recovery

    call = {"role": "assistant", "reasoning_content": "I need the capital of France, so I will search for it.",
            "content": "", "tool_calls": [{"name": "search_web", "arguments": {"query": "capital of France"}}]}
    messages = [*_item().messages, call, {"role": "tool", "content": "Paris is the capital of France."},
                {"role": "assistant", "reasoning_content": "Found it.", "content": "Paris"}]
    for seed in range(3):
        broken, response = with_recovery(messages, random.Random(seed))[2:4]
        record, backend, _ = _run(tokenizer, [broken["reasoning_content"], CALL, ANSWER], budget=1, max_new=400)
        assert (record.tool_calls, record.tool_failures, record.answer) == (2, 1, "Paris")
        assert backend.queries == ["capital of France"]
        text = tokenizer.decode(record.tokens)
        assert f"<tool_response>\n{response['content']}\n</tool_response>" in text, response


@pytest.mark.parametrize("end", ["<|endoftext|>", "<|im_end|>"])
def test_a_malformed_call_ending_the_turn_is_followed_by_exactly_one_im_end(tokenizer, end):
    record, backend, _ = _run(tokenizer, ["</think>\n\n<tool_call>garbage" + end, ANSWER])
    assert backend.queries == [] and (record.tool_calls, record.tool_failures, record.finish_reason) == (1, 1, "answer")
    text = tokenizer.decode(record.tokens[record.prompt_length :])
    head = text.split("<tool_response>")[0]
    assert head == "</think>\n\n<tool_call>garbage" + end.replace("<|im_end|>", "") + "<|im_end|>\n<|im_start|>user\n"


def test_one_run_mixes_per_prompt_budgets(tokenizer):
    """Budgets 0, 1, 2 and None (AgentConfig.budget = 1) in one batch; the model calls three times, then answers."""
    backend = CountingBackend(DOCS)
    agent = SearchAgent(_scripted(tokenizer, [CALL, CALL, CALL, ANSWER]), backend, AgentConfig(1, 400))
    items = [PromptItem.from_record({"id": f"b{b}", "question": "Capital of France?"}, b) for b in (0, 1, 2)]
    items.append(PromptItem("default", items[1].messages))
    records = run_rollouts(agent, items, 1, jax.random.key(0))
    got = {r.prompt_id: (r.budget, r.tool_calls, r.tool_failures, r.finish_reason) for r in records}
    assert got == {
        "b0": (0, 2, 2, "budget"),  # the first call fails (told), the second ends the rollout
        "b1": (1, 3, 2, "budget"),
        "b2": (2, 3, 1, "answer"),  # two searches, the third call fails, then the answer
        "default": (1, 3, 2, "budget"),
    }
    assert len(backend.queries) == 0 + 1 + 2 + 1
    with pytest.raises(ValueError, match="budget"):
        PromptItem("x", items[0].messages, budget=-1)


@pytest.mark.parametrize("bad", [
    "</think>\n\n<tool_call>\n<function=search_web>\n</function>\n</tool_call>",  # required query missing
    "</think>\n\n<tool_call>\n<function=open_url>\n<parameter=url>\nx\n</parameter>\n</function>\n</tool_call>",
    "</think>\n\n<tool_call>garbage</tool_call>",
    "</think>\n\n</tool_call>",
])
def test_malformed_tool_calls_still_give_a_complete_record(tokenizer, bad):
    record, backend, _ = _run(tokenizer, [bad, ANSWER])
    assert backend.queries == []
    assert (record.tool_calls, record.tool_failures, record.finish_reason, record.answer) == (1, 1, "answer", "Paris")


def test_a_model_that_never_stops_gives_a_complete_record(tokenizer):
    record, _, _ = _run(tokenizer, ["the river Avon "], max_new=37)
    assert (record.finish_reason, record.response_length, record.tool_calls) == ("max_tokens", 37, 0)


def test_a_prompt_longer_than_the_cache_gives_a_context_record_not_an_error(tokenizer):
    backend = CountingBackend(DOCS)
    agent = SearchAgent(_scripted(tokenizer, [ANSWER], max_len=64), backend, AgentConfig(2, 50))
    seen = []
    records = run_rollouts(agent, [_item()], 2, jax.random.key(0), on_record=seen.append)
    assert [r.finish_reason for r in records] == ["context", "context"] and seen == records
    for r in records:
        r.check()
        assert (r.response_length, r.tool_calls, r.answer) == (0, 0, "")
        assert r.prompt_length == len(r.tokens) == 64 and r.tokens == agent.prompt_ids(_item())[:64]


@pytest.mark.parametrize("script, room, searched", [
    (["the river Avon "], 10, 0),  # the cache fills during a generation
    ([CALL, ANSWER], None, 1),  # the call is made, its tool response does not fit
])
def test_context_records_fit_max_len(tokenizer, script, room, searched):
    prompt = len(SearchAgent(_scripted(tokenizer, script), MemoryBackend(DOCS), AgentConfig()).prompt_ids(_item()))
    max_len = prompt + (room or len(tokenizer.encode(CALL)) + 5)
    record, backend, _ = _run(tokenizer, script, max_new=400, driver=_scripted(tokenizer, script, max_len))
    assert record.finish_reason == "context" and len(record.tokens) <= max_len and len(backend.queries) == searched
    assert len(record.tokens) == (max_len if room else prompt + len(tokenizer.encode(CALL)))


def test_records_carry_sampling_key_version_and_a_readable_transcript(tokenizer, tmp_path):
    driver = _scripted(tokenizer, [BAD, CALL, ANSWER])
    driver.version = 3
    sampling = Sampling(0.6, 0.9, 20)
    agent = SearchAgent(driver, CountingBackend(DOCS), AgentConfig(1, 400, sampling))
    key = jax.random.key(11)
    records = run_rollouts(agent, [_item(budget=1)], 2, key, reference_params=object())
    a = records[1]
    assert (a.temperature, a.top_p, a.top_k, a.policy_version, a.budget) == (0.6, 0.9, 20, 3, 1)
    assert [r.policy_version for r in records] == [3, 3, -1] and driver.version == 3
    np.testing.assert_array_equal(jax.random.key_data(a.prng_key()),
                                  jax.random.key_data(jax.random.fold_in(jax.random.fold_in(key, 0), 1)))
    assert a.question == "What is the capital of France?" and a.gold is None and a.r_base is None
    assert [t["text"] for t in a.turns] == [BAD, CALL, ANSWER]
    assert [[(c["name"], c["arguments"], c["ok"]) for c in t["tool_calls"]] for t in a.turns] == [
        [("", {}, False)], [("search_web", {"query": "capital of France"}, True)], []]
    assert a.turns[0]["tool_calls"][0]["error"].startswith("malformed: ")
    path = tmp_path / "r.jsonl"
    write_jsonl(records, path)
    assert read_jsonl(path) == records


def test_old_records_read_and_mistyped_fields_are_named(tokenizer, tmp_path):
    record, _, _ = _run(tokenizer, [CALL, ANSWER])
    old = {k: v for k, v in dataclasses.asdict(record).items() if k in OLD_FIELDS}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n" + json.dumps(dict(old, policy_version="3")) + "\n")
    with pytest.raises(ValueError, match=r"old.jsonl:2: .*field policy_version must be an int or null, got '3'"):
        read_jsonl(path)
    path.write_text(json.dumps(old) + "\n")
    (back,) = read_jsonl(path)
    assert back.tokens == record.tokens and (back.policy_version, back.temperature, back.turns) == (None, None, None)
    with pytest.raises(ValueError, match="no key_data"):
        back.prng_key()


OLD_FIELDS = ("prompt_id", "group_index", "tokens", "loss_mask", "logprobs", "prompt_length", "tool_calls",
              "tool_failures", "response_length", "answer", "finish_reason", "model", "timings")


def test_records_round_trip_jsonl_and_pad(tokenizer, tmp_path):
    a, _, _ = _run(tokenizer, [CALL, ANSWER])
    b, _, _ = _run(tokenizer, ["the river Avon "], max_new=5)
    path = tmp_path / "r.jsonl"
    assert write_jsonl([a, b], path) == 2
    assert read_jsonl(path) == [a, b]
    arrays = to_arrays([a, b], pad_id=tokenizer.special.pad)
    assert arrays["tokens"].shape == (2, len(a.tokens))
    np.testing.assert_array_equal(arrays["tokens"][1, len(b.tokens) :], tokenizer.special.pad)
    np.testing.assert_array_equal(arrays["loss_mask"].sum(1), [a.response_length, b.response_length])
    np.testing.assert_array_equal(arrays["tool_calls"], [1, 0])
    with pytest.raises(ValueError, match="longer than max_len"):
        to_arrays([a], max_len=10, pad_id=tokenizer.special.pad)
    bad = dataclasses.replace(b, logprobs=[-1.0] * len(b.tokens))
    with pytest.raises(ValueError, match="logprobs must be 0"):
        bad.check()


def test_groups_and_reference_with_the_real_engine(engine, params, cfg, tokenizer):
    driver = RolloutDriver(engine, params)
    agent = SearchAgent(driver, CountingBackend(DOCS), AgentConfig(budget=2, max_new_tokens=6, sampling=Sampling(1.0)))
    items = [_item(), PromptItem.from_record({"id": "q2", "question": "Which river flows through Bath?"}, 2)]
    reference = params.replace(lm_head=-params.lm_head)
    policy_params = driver.params
    records = run_rollouts(agent, items, 3, jax.random.key(5), reference_params=reference)
    assert driver.params is policy_params
    assert [(r.prompt_id, r.group_index, r.model) for r in records] == [
        ("q1", 0, "policy"), ("q1", 1, "policy"), ("q1", 2, "policy"),
        ("q2", 0, "policy"), ("q2", 1, "policy"), ("q2", 2, "policy"),
        ("q1", -1, "reference"), ("q2", -1, "reference"),
    ]
    for r in records:
        r.check()
    group = [tuple(r.tokens[r.prompt_length :]) for r in records[:3]]
    assert len(set(group)) == 3, "independent keys give different rollouts"
    # μ_infer of a whole agent record equals the training forward pass (reference weights for the reference).
    for r, p in ((records[0], params), (records[-1], reference)):
        padded = np.zeros((1, 512), np.int32)  # one shape for both: one compilation
        padded[0, : len(r.tokens)] = r.tokens
        logits = M.forward(p, jnp.asarray(padded), cfg)[0]
        at = np.flatnonzero(r.loss_mask)
        logp = sampling_logprobs(logits[at - 1], SamplingArrays.of([Sampling(1.0)] * len(at)))
        np.testing.assert_allclose(np.asarray(r.logprobs)[at], np.asarray(logp)[np.arange(len(at)), np.asarray(r.tokens)[at]], atol=1e-4)


def test_a_real_model_stops_exactly_at_tool_call_end(engine, params, tokenizer, scripted):
    """The real engine, scripted to emit <tool_call></tool_call> after each generation prompt."""
    s = tokenizer.special
    newline = tokenizer.encode("\n")[0]
    driver = RolloutDriver(engine, scripted(params, {newline: s.tool_call, s.tool_call: s.tool_call_end, s.tool_call_end: s.tool_call}))
    agent = SearchAgent(driver, CountingBackend(DOCS), AgentConfig(budget=1, max_new_tokens=6, sampling=Sampling(1.0)))
    (record,) = run_rollouts(agent, [_item(budget=1)], 1, jax.random.key(0))
    record.check()
    assert _policy_spans(record) == [[s.tool_call, s.tool_call_end]] * 3
    # Malformed calls consume no budget: the rollout runs until its policy-token budget is spent.
    assert (record.tool_calls, record.tool_failures, record.finish_reason) == (3, 3, "max_tokens")
    assert driver.stats.resumed == 2  # turns 2 and 3 continued the cache of the turn before
