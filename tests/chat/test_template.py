"""The Qwen3.5 chat template: byte-exact on QWEN35.md §6.3's example and each rule listed there."""

import json

import pytest

from searchjax.chat import ChatTemplateError, render, render_segments

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}, "verbose": {"type": "boolean"}},
            "required": ["location"],
        },
    },
}

# QWEN35.md §6.3, "Rendered example (system + one tool + tool call + tool result + follow-up, thinking on)".
EXPECTED_EXAMPLE = """<|im_start|>system
# Tools

You have access to the following functions:

<tools>
{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"location": {"type": "string"}, "verbose": {"type": "boolean"}}, "required": ["location"]}}}
</tools>

If you choose to call a function ONLY reply in the following format with NO suffix:

<tool_call>
<function=example_function_name>
<parameter=example_parameter_1>
value_1
</parameter>
<parameter=example_parameter_2>
This is the value for the second parameter
that can span
multiple lines
</parameter>
</function>
</tool_call>

<IMPORTANT>
Reminder:
- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags
- Required parameters MUST be specified
- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after
- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls
</IMPORTANT>

You are a helpful assistant.<|im_end|>
<|im_start|>user
What's the weather in Paris?<|im_end|>
<|im_start|>assistant
I'll check.

<tool_call>
<function=get_weather>
<parameter=location>
Paris
</parameter>
<parameter=verbose>
True
</parameter>
</function>
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
22C
</tool_response><|im_end|>
<|im_start|>user
Thanks<|im_end|>
<|im_start|>assistant
<think>
"""


def example_messages(arguments):
    call = {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "I'll check.", "tool_calls": [call]},
        {"role": "tool", "content": "22C"},
        {"role": "user", "content": "Thanks"},
    ]


@pytest.mark.parametrize("arguments", [{"location": "Paris", "verbose": True}, '{"location": "Paris", "verbose": true}'])
def test_byte_exact_example(arguments):
    assert render(example_messages(arguments), tools=[WEATHER_TOOL]) == EXPECTED_EXAMPLE


def test_segments_join_to_render_and_mark_only_assistant_text():
    segments = render_segments(example_messages({"location": "Paris", "verbose": True}), tools=[WEATHER_TOOL])
    assert "".join(s.text for s in segments) == EXPECTED_EXAMPLE
    trainable = [s.text for s in segments if s.trainable]
    assert trainable == [EXPECTED_EXAMPLE.split("<|im_start|>assistant\n")[1].split("\n<|im_start|>user")[0]]
    assert trainable[0].endswith("</tool_call><|im_end|>")


def test_a_weight_0_turn_renders_alike_and_is_not_trainable():
    messages = example_messages({"location": "Paris", "verbose": True})
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    weighted = [*messages[:first], {**messages[first], "weight": 0}, *messages[first + 1 :]]
    segments = render_segments(weighted, tools=[WEATHER_TOOL])
    assert "".join(s.text for s in segments) == EXPECTED_EXAMPLE
    trainable = [s.text for s in render_segments(messages, tools=[WEATHER_TOOL]) if s.trainable]
    assert [s.text for s in segments if s.trainable] == trainable[1:]
    for bad in (2, -1, True, "0"):
        with pytest.raises(ChatTemplateError, match=rf"messages\[{first}\]\.weight must be 0 or 1, got {bad!r}"):
            render([*messages[:first], {**messages[first], "weight": bad}])


def test_system_without_tools_and_no_generation_prompt():
    msgs = [{"role": "system", "content": "  Be brief.\n"}, {"role": "user", "content": "\nHi "}]
    assert render(msgs, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_generation_prompt_thinking_off():
    out = render([{"role": "user", "content": "Hi"}], enable_thinking=False)
    assert out == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_thinking_kept_only_after_last_user_query():
    msgs = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "", "reasoning_content": " r2 ",
         "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
        {"role": "tool", "content": "t"},
        {"role": "assistant", "content": "<think>\nr3\n</think>\n\na3"},
    ]  # fmt: skip
    assert render(msgs, add_generation_prompt=False) == (
        "<|im_start|>user\nq1<|im_end|>\n"
        "<|im_start|>assistant\na1<|im_end|>\n"
        "<|im_start|>user\nq2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nr2\n</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nt\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nr3\n</think>\n\na3<|im_end|>\n"
    )


def test_wrapped_tool_response_user_message_is_not_a_query():
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "r"},
        {"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
        {"role": "assistant", "content": "b", "reasoning_content": "s"},
    ]
    out = render(msgs, add_generation_prompt=False)
    assert "<|im_start|>assistant\n<think>\nr\n</think>\n\na<|im_end|>" in out
    assert "<|im_start|>assistant\n<think>\ns\n</think>\n\nb<|im_end|>" in out


def test_consecutive_tool_results_grouped_and_multiple_calls_spaced():
    calls = [{"function": {"name": "f", "arguments": {"a": 1}}}, {"name": "g", "arguments": {"b": [1, "é"]}}]
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "one"},
        {"role": "tool", "content": "two"},
    ]
    assert render(msgs, add_generation_prompt=False) == (
        "<|im_start|>user\nq<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>\n"
        '<tool_call>\n<function=g>\n<parameter=b>\n[1, "é"]\n</parameter>\n</function>\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n</tool_response><|im_end|>\n"
    )


@pytest.mark.parametrize(
    "value, text",
    [("raw  text\n", "raw  text\n"), (None, "None"), (False, "False"), (2.5, "2.5"),
     ({"k": "ü", "n": [1, 2]}, '{"k": "ü", "n": [1, 2]}'), ([], "[]")],
)  # fmt: skip
def test_argument_formatting(value, text):
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x",
            "tool_calls": [{"function": {"name": "f", "arguments": {"p": value}}}]}]  # fmt: skip
    assert f"x\n\n<tool_call>\n<function=f>\n<parameter=p>\n{text}\n</parameter>\n" in render(msgs)


def test_tools_are_tojson_lines_without_ascii_escapes():
    tool = {"type": "function", "function": {"name": "s", "description": "Suche – im Netz", "parameters": {}}}
    out = render([{"role": "user", "content": "q"}], tools=[tool, WEATHER_TOOL])
    assert "<tools>\n" + json.dumps(tool, ensure_ascii=False) + "\n" + json.dumps(WEATHER_TOOL) + "\n</tools>" in out
    assert "</IMPORTANT><|im_end|>\n<|im_start|>user\nq" in out  # no system message: nothing appended


def test_list_content_with_text_and_images():
    content = [{"type": "text", "text": "look "}, {"type": "image", "image": "x.png"}, {"type": "text", "text": " ok"}]
    out = render([{"role": "user", "content": content}], add_generation_prompt=False)
    assert out == "<|im_start|>user\nlook <|vision_start|><|image_pad|><|vision_end|> ok<|im_end|>\n"


@pytest.mark.parametrize(
    "messages, message",
    [
        ([], "No messages provided."),
        ([{"role": "system", "content": "s"}], "No user query found in messages."),
        ([{"role": "user", "content": "<tool_response>x</tool_response>"}], "No user query found in messages."),
        ([{"role": "user", "content": "q"}, {"role": "system", "content": "s"}],
         "System message must be at the beginning."),
        ([{"role": "user", "content": "q"}, {"role": "critic", "content": "s"}], "unexpected message role 'critic'"),
        ([{"role": "user", "content": 3}], "messages[0].content: unexpected content type int"),
        ([{"role": "user", "content": "q"}, "hi"], "messages[1] must be a dict with 'role', got str"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
          "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}],
         "messages[1].tool_calls[0]: arguments are not valid JSON"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
          "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}],
         "arguments must be a JSON object, got list"),
        ([{"role": "system", "content": [{"type": "image"}]}, {"role": "user", "content": "q"}],
         "System message cannot contain images."),
    ],
)  # fmt: skip
def test_errors(messages, message):
    with pytest.raises(ChatTemplateError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        render(messages)
