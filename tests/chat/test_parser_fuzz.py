"""Fuzzing parse_assistant with 6,300 random and mutated model outputs: it never raises, a turn it accepts is
well-formed (valid calls, and re-rendering it parses back to the same turn), and broken structure is reported."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.chat import ParsedTurn, parse_assistant, render_segments, tool_schemas

TOOLS = [
    {"type": "function", "function": {"name": "search_web", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "k": {"type": "integer"}, "fresh": {"type": "boolean"},
        "filters": {"type": "object"}}, "required": ["query"]}}},
    {"type": "function", "function": {"name": "finish", "parameters": {"type": "object", "properties": {
        "answer": {"type": "string"}}, "required": ["answer"]}}},
]  # fmt: skip
SCHEMAS = tool_schemas(TOOLS)
FRAGMENTS = (
    "<tool_call>", "</tool_call>", "<function=", "<function=search_web>", "<function=finish>", "</function>",
    "<parameter=", "<parameter=query>", "<parameter=k>", "<parameter=fresh>", "<parameter=answer>", "</parameter>",
    "<think>", "</think>", "<tool_response>", "</tool_response>", "<|im_end|>", "<|im_start|>", "<|endoftext|>",
    "\n", "\n\n", " ", ">", "<", "=", "True", "false", "12", "-3.5", "{", "}", '{"a": 1}', "[", "]", "null", "é", "東",
)  # fmt: skip


def call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def generated_text(message):
    """The policy's output for ``message`` after the ``<think>\\n`` generation prompt."""
    segments = render_segments([{"role": "user", "content": "q"}, message], add_generation_prompt=False)
    (body,) = [s.text for s in segments if s.trainable]
    return body[len("<think>\n"):]


VALID_MESSAGES = [
    {"role": "assistant", "reasoning_content": "I should search.", "content": "",
     "tool_calls": [call("search_web", query="capital of Xarn", k=5)]},
    {"role": "assistant", "reasoning_content": "Two lookups.", "content": "Searching twice.",
     "tool_calls": [call("search_web", query="a\nb", fresh=False, filters={"y": [1]}), call("finish", answer="42")]},
    {"role": "assistant", "reasoning_content": "Known.", "content": "The answer is 42."},
]  # fmt: skip
VALID_TEXTS = [generated_text(m) for m in VALID_MESSAGES]


def assert_well_formed(turn: ParsedTurn) -> None:
    """Types are right; an error-free turn has schema-valid calls and survives render → parse unchanged."""
    assert isinstance(turn.content, str) and isinstance(turn.reasoning, str)
    assert all(isinstance(e, str) and e for e in turn.errors)
    assert all(isinstance(c.arguments, dict) for c in turn.tool_calls)
    if not turn.ok:
        return
    for c in turn.tool_calls:
        assert c.name in SCHEMAS and set(SCHEMAS[c.name]["required"]) <= set(c.arguments)
    message = {"role": "assistant", "reasoning_content": turn.reasoning, "content": turn.content,
               "tool_calls": [call(c.name, **c.arguments) for c in turn.tool_calls]}  # fmt: skip
    again = parse_assistant(generated_text(message), TOOLS)
    assert again.errors == []
    assert (again.content, again.reasoning) == (turn.content, turn.reasoning)
    assert [(c.name, c.arguments) for c in again.tool_calls] == [(c.name, c.arguments) for c in turn.tool_calls]


random_outputs = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6)), max_size=30).map("".join)


@pytest.mark.slow  # ~7 s
@settings(max_examples=3000, deadline=None)
@given(random_outputs)
def test_random_outputs_never_raise(text):
    assert_well_formed(parse_assistant(text, TOOLS))


@st.composite
def mutated_outputs(draw):
    """A valid output with 0–4 random edits: delete, duplicate or move a slice, insert a fragment, truncate."""
    text = draw(st.sampled_from(VALID_TEXTS))
    for _ in range(draw(st.integers(0, 4))):
        i, j = sorted(draw(st.tuples(st.integers(0, len(text)), st.integers(0, len(text)))))
        k = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["delete", "duplicate", "insert", "truncate", "move"]))
        if op == "delete":
            text = text[:i] + text[j:]
        elif op == "duplicate":
            text = text[:k] + text[i:j] + text[k:]
        elif op == "insert":
            text = text[:k] + draw(st.sampled_from(FRAGMENTS) | st.text(max_size=4)) + text[k:]
        elif op == "truncate":
            text = text[:i]
        else:
            piece, rest = text[i:j], text[:i] + text[j:]
            k = min(k, len(rest))
            text = rest[:k] + piece + rest[k:]
    return text


@pytest.mark.slow  # ~7 s
@settings(max_examples=3000, deadline=None)
@given(mutated_outputs())
def test_mutated_outputs_never_raise(text):
    turn = parse_assistant(text, TOOLS)
    assert_well_formed(turn)
    if text in VALID_TEXTS:
        assert turn.ok


@st.composite
def broken_outputs(draw):
    """A valid output with one structural defect that must be reported."""
    text = draw(st.sampled_from(VALID_TEXTS[:2]))
    defect = draw(st.sampled_from(["</tool_call>", "</function>", "</parameter>", "</think>", "name", "required"]))
    if defect == "name":
        return text.replace("<function=search_web>", "<function=" + draw(st.sampled_from(["searchweb", "x"])) + ">")
    if defect == "required":
        return text.replace("<parameter=query>", "<parameter=" + draw(st.sampled_from(["qry", "k2"])) + ">")
    starts = [p for p in range(len(text)) if text.startswith(defect, p)]
    at = draw(st.sampled_from(starts))
    return text[:at] + text[at + len(defect):]


@settings(max_examples=300, deadline=None)
@given(broken_outputs())
def test_structural_defects_are_reported(text):
    turn = parse_assistant(text, TOOLS)
    assert_well_formed(turn)
    assert turn.errors


@pytest.mark.parametrize("text", VALID_TEXTS)
def test_valid_texts_parse_cleanly(text):
    assert parse_assistant(text, TOOLS).errors == []
