"""parse_assistant: round trip with the renderer, schema conversion, and every malformed case named in issue 4."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.chat import parse_assistant, render_segments

SEARCH = {
    "type": "function",
    "function": {
        "name": "search_web",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "k": {"type": "integer"},
                "fresh": {"type": "boolean"},
                "lang": {"type": "string", "enum": ["en", "de"]},
                "filters": {"type": "object"},
                "sites": {"type": "array"},
                "boost": {"type": ["number", "null"]},
            },
            "required": ["query"],
        },
    },
}
TOOLS = [SEARCH, {"name": "finish", "parameters": {"properties": {"answer": {"type": "string"}}, "required": ["answer"]}}]


def generated_text(message):
    """What the policy generates for ``message`` after the thinking generation prompt (``…<think>\\n``)."""
    segments = render_segments([{"role": "user", "content": "q"}, message], add_generation_prompt=False)
    (body,) = [s.text for s in segments if s.trainable]
    assert body.startswith("<think>\n")
    return body[len("<think>\n"):]


def call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def test_round_trip_with_typed_arguments():
    args = {"query": "  Paris\nweather ", "k": 3, "fresh": True, "lang": "de", "filters": {"a": [1, None]},
            "sites": ["x.org"], "boost": None}  # fmt: skip
    message = {"role": "assistant", "reasoning_content": "Need data.", "content": "Let me search.",
               "tool_calls": [call("search_web", **args), call("finish", answer="42")]}  # fmt: skip
    turn = parse_assistant(generated_text(message), TOOLS)
    assert turn.errors == []
    assert (turn.reasoning, turn.content) == ("Need data.", "Let me search.")
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("search_web", args), ("finish", {"answer": "42"})]
    assert turn.valid_calls == turn.tool_calls


texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(reasoning=texts, content=texts, query=texts.filter(lambda s: s.replace("<", "").strip()), k=st.integers(-10**6, 10**6),
       boost=st.floats(allow_nan=False, allow_infinity=False), n_calls=st.integers(0, 3))  # fmt: skip
def test_round_trip_property(reasoning, content, query, k, boost, n_calls):
    for tag in ("<", "\r"):  # tag-free free text; the raw parameter value keeps its own whitespace
        reasoning, content = reasoning.replace(tag, ""), content.replace(tag, "")
    query = query.replace("<", "")
    calls = [call("search_web", query=query, k=k, boost=boost)] * n_calls
    message = {"role": "assistant", "reasoning_content": reasoning, "content": content, "tool_calls": calls}
    turn = parse_assistant(generated_text(message), TOOLS)
    assert turn.errors == []
    assert turn.reasoning == reasoning.strip() and turn.content == content.strip()
    assert [c.arguments for c in turn.tool_calls] == [{"query": query, "k": k, "boost": boost}] * n_calls


def test_plain_answer_and_thinking_off():
    assert parse_assistant("hmm\n</think>\n\nThe answer is 4.<|im_end|>").content == "The answer is 4."
    off = parse_assistant("The answer is 4.", thinking=False)
    assert (off.reasoning, off.content, off.errors) == (None, "The answer is 4.", [])
    explicit = parse_assistant("<think>\nr\n</think>\n\nA", thinking=False)
    assert (explicit.reasoning, explicit.content, explicit.errors) == ("r", "A", [])


def test_without_tools_values_stay_strings():
    turn = parse_assistant("r</think><tool_call>\n<function=any>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>")
    assert turn.errors == [] and turn.tool_calls[0].arguments == {"n": "3"}


def block(body):
    return f"<tool_call>\n{body}</tool_call>"


GOOD = "<function=search_web>\n<parameter=query>\nx\n</parameter>\n</function>\n"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("thinking forever", "unclosed <think>"),
        ("<think>\nr</think>a", "duplicate <think>"),
        ("r<tool_call>" + GOOD + "</tool_call>", "nested <tool_call> in the thinking block"),
        ("r</think>" + "<tool_call>\n" + GOOD, "unclosed <tool_call>"),
        ("r</think>" + block("<function=search_web>\n<parameter=query>\nx\n</parameter>\n"), "unclosed <function=…>"),
        ("r</think>" + block("<function=search_web>\n<parameter=query>\nx\n</function>\n"), "unclosed or malformed <parameter"),
        ("r</think>" + block("<parameter=query>\nx\n</parameter>\n"), "missing <function=NAME>"),
        ("r</think>" + block("<function=search_web\n</function>\n"), "malformed <function=NAME>"),
        ("r</think>" + block(GOOD.replace("search_web", "browse")), "unknown function 'browse'"),
        ("r</think>" + block("<function=search_web>\n</function>\n"), "missing required parameter 'query'"),
        ("r</think>" + block(GOOD.replace("\nx\n", "\n  \n")), "parameter 'query' is empty"),
        ("r</think>" + block(GOOD.replace("query", "q")), "unknown parameter 'q'"),
        ("r</think>" + block(GOOD.replace("</function>", "<parameter=k>\nmany\n</parameter>\n</function>")),
         "parameter 'k': 'many' is not of type integer"),
        ("r</think>" + block(GOOD.replace("</function>", "<parameter=fresh>\nyes\n</parameter>\n</function>")),
         "not of type boolean"),
        ("r</think>" + block(GOOD.replace("</function>", "<parameter=k>\nNaN\n</parameter>\n</function>")),
         "not of type integer"),
        ("r</think>" + block(GOOD.replace("</function>", "<parameter=lang>\nfr\n</parameter>\n</function>")),
         "'fr' is not one of ['en', 'de']"),
        ("r</think>" + block(GOOD.replace("</function>", "<parameter=filters>\n[1]\n</parameter>\n</function>")),
         "not of type object"),
        ("r</think>" + block(GOOD.replace("</function>", "<parameter=query>\ny\n</parameter>\n</function>")),
         "duplicate parameter 'query'"),
        ("r</think>" + block(GOOD.replace("</parameter>\n", "</parameter>\njunk\n")), "unexpected text between parameters"),
        ("r</think>" + block("so " + GOOD), "unexpected text before <function=…>"),
        ("r</think>" + block(GOOD + "tail"), "unexpected text after </function>"),
        ("r</think>" + block(GOOD.replace("</function>", GOOD + "</function>")), "nested or duplicate <function=…>"),
        ("r</think>" + "<tool_call>\n<tool_call>\n" + GOOD + "</tool_call>", "nested <tool_call> inside <tool_call>"),
        ("r</think>" + block(GOOD) + "\nok\n" + block(GOOD), "unexpected text between tool calls"),
        ("r</think>" + block(GOOD) + " and done", "unexpected text after the last tool call"),
        ("r</think>a</think>b", "unexpected </think> in content"),
        ("r</think>a</tool_call>", "unexpected </tool_call> in content"),
        ("r</think>a<|im_end|>more", "text after <|im_end|>"),
        ("r</think>a<|im_start|>user\nhi", "unexpected <|im_start|>"),
    ],
)  # fmt: skip
def test_malformed_output_is_reported(text, expected):
    turn = parse_assistant(text, TOOLS)
    assert any(expected in e for e in turn.errors), turn.errors
    assert not turn.ok


def test_invalid_call_is_listed_with_its_errors_next_to_valid_ones():
    turn = parse_assistant("r</think>" + block(GOOD.replace("search_web", "nope")) + "\n" + block(GOOD), TOOLS)
    assert [c.name for c in turn.tool_calls] == ["nope", "search_web"]
    assert not turn.tool_calls[0].ok and turn.tool_calls[1].ok
    assert turn.valid_calls == [turn.tool_calls[1]]
    assert turn.errors == ["tool call 0: unknown function 'nope' (known: finish, search_web)"]


@pytest.mark.parametrize("tools", [[{"function": {"parameters": {}}}], [{"name": "f", "parameters": []}],
                                   [{"name": "f", "parameters": {"properties": {"a": 1}}}]])  # fmt: skip
def test_malformed_tool_definitions_raise(tools):
    with pytest.raises(ValueError, match=r"tools\[0\]"):
        parse_assistant("x", tools)
