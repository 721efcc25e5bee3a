"""The Qwen3.5 chat template in Python (QWEN35.md §6.3), byte-exact with the official Jinja template.

Messages are OpenAI-style dicts: ``{"role": "system"|"user"|"assistant"|"tool", "content": ...}``; assistant
messages may carry ``reasoning_content`` (str) and ``tool_calls`` (``[{"function": {"name", "arguments"}}]`` or
``[{"name", "arguments"}]``, arguments a dict or a JSON object string), and ``weight`` (1, the default, or 0:
the turn is context, not a target, as in OpenAI's fine-tuning format; the Jinja template ignores the key). Content
is a string, None, or a list of parts (``{"type": "text", "text": ...}``, image or video parts).

The renderer produces a list of `Segment`s whose concatenation is the rendered text; a segment is ``trainable``
exactly when the policy generates it (an assistant turn after ``<|im_start|>assistant\\n`` through its
``<|im_end|>``) and the turn's ``weight`` is not 0. `render` joins them;
`searchjax.chat.tokenizer.encode_conversation` encodes them one by one to build the loss mask.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"

TOOLS_HEADER = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
TOOLS_INSTRUCTIONS = (
    "\n</tools>"
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\n"
    "multiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be "
    "nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function "
    "call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n"
    "</IMPORTANT>"
)

NO_MESSAGES = "No messages provided."
NO_USER_QUERY = "No user query found in messages."
SYSTEM_NOT_FIRST = "System message must be at the beginning."


class ChatTemplateError(ValueError):
    """A conversation the Qwen3.5 template refuses (same messages as the Jinja ``raise_exception``)."""


@dataclasses.dataclass(frozen=True)
class Segment:
    """A piece of rendered text; ``trainable`` marks text the assistant generates (loss mask 1)."""

    text: str
    trainable: bool = False


def tojson(value: Any) -> str:
    """HF's Jinja ``tojson``: ``json.dumps`` with ``ensure_ascii=False``, default separators, key order kept."""
    return json.dumps(value, ensure_ascii=False)


def render_content(content: Any, where: str, *, is_system: bool = False) -> str:
    """The template's ``render_content`` macro, without the outer ``|trim``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, Mapping)):
        return "".join(_render_part(item, f"{where}[{i}]", is_system) for i, item in enumerate(content))
    raise ChatTemplateError(f"{where}: unexpected content type {type(content).__name__} (expected str, list or None)")


def _render_part(item: Any, where: str, is_system: bool) -> str:
    if not isinstance(item, Mapping):
        raise ChatTemplateError(f"{where}: content part must be a dict, got {type(item).__name__}")
    if "image" in item or "image_url" in item or item.get("type") == "image":
        if is_system:
            raise ChatTemplateError("System message cannot contain images.")
        return IMAGE_PLACEHOLDER
    if "video" in item or item.get("type") == "video":
        if is_system:
            raise ChatTemplateError("System message cannot contain videos.")
        return VIDEO_PLACEHOLDER
    if "text" in item:
        return str(item["text"])
    raise ChatTemplateError(f"{where}: unexpected item type in content (keys {sorted(item)})")


def tool_call_arguments(call: Mapping[str, Any], where: str) -> tuple[str, dict[str, Any]]:
    """(name, arguments dict) of one OpenAI-style tool call; a JSON-string ``arguments`` is decoded."""
    fn = call["function"] if "function" in call else call
    if "name" not in fn:
        raise ChatTemplateError(f"{where}: tool call has no 'name'")
    args = fn.get("arguments", {})
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as err:
            raise ChatTemplateError(f"{where}: arguments are not valid JSON ({err})") from err
    if not isinstance(args, Mapping):
        raise ChatTemplateError(f"{where}: arguments must be a JSON object, got {type(args).__name__}")
    return str(fn["name"]), dict(args)


def format_argument(value: Any) -> str:
    """One parameter value as the template prints it: strings raw, dicts/lists ``tojson``, else ``str()``."""
    if isinstance(value, str):
        return value
    if isinstance(value, (Mapping, list, tuple)):
        return tojson(value)
    return str(value)


def render_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """``<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n…</function>\\n</tool_call>``."""
    params = "".join(f"<parameter={k}>\n{format_argument(v)}\n</parameter>\n" for k, v in arguments.items())
    return f"{TOOL_CALL_OPEN}\n<function={name}>\n{params}</function>\n{TOOL_CALL_CLOSE}"


def _tools_system(tools: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]]) -> str:
    text = IM_START + "system\n" + TOOLS_HEADER + "".join("\n" + tojson(t) for t in tools) + TOOLS_INSTRUCTIONS
    if messages[0].get("role") == "system":
        content = render_content(messages[0].get("content"), "messages[0].content", is_system=True).strip()
        if content:
            text += "\n\n" + content
    return text + IM_END + "\n"


def last_query_index(messages: Sequence[Mapping[str, Any]]) -> int:
    """Index of the last user message that is not a wrapped ``<tool_response>``; raises if none."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") != "user":
            continue
        content = render_content(message.get("content"), f"messages[{index}].content").strip()
        if not (content.startswith(TOOL_RESPONSE_OPEN) and content.endswith(TOOL_RESPONSE_CLOSE)):
            return index
    raise ChatTemplateError(NO_USER_QUERY)


def split_reasoning(message: Mapping[str, Any], content: str) -> tuple[str, str]:
    """(reasoning, content) of an assistant message: ``reasoning_content`` if a string, else from ``</think>``."""
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str):
        return reasoning.strip(), content
    if THINK_CLOSE in content:
        head, tail = content.split(THINK_CLOSE)[0], content.split(THINK_CLOSE)[-1]
        return head.rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n").strip(), tail.lstrip("\n")
    return "", content


def _assistant(message: Mapping[str, Any], index: int, after_query: bool) -> list[Segment]:
    content = render_content(message.get("content"), f"messages[{index}].content").strip()
    reasoning, content = split_reasoning(message, content)
    body = f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n{content}" if after_query else content
    calls = message.get("tool_calls") or []
    if isinstance(calls, Mapping) or isinstance(calls, str):
        raise ChatTemplateError(f"messages[{index}].tool_calls must be a list, got {type(calls).__name__}")
    for k, call in enumerate(calls):
        name, args = tool_call_arguments(call, f"messages[{index}].tool_calls[{k}]")
        sep = ("\n\n" if content.strip() else "") if k == 0 else "\n"
        body += sep + render_tool_call(name, args)
    weight = message.get("weight", 1)
    if weight not in (0, 1) or isinstance(weight, bool):
        raise ChatTemplateError(f"messages[{index}].weight must be 0 or 1, got {weight!r}")
    return [Segment(IM_START + "assistant\n"), Segment(body + IM_END, trainable=weight == 1), Segment("\n")]


def _tool(messages: Sequence[Mapping[str, Any]], index: int) -> str:
    content = render_content(messages[index].get("content"), f"messages[{index}].content").strip()
    # As in the Jinja template: the user envelope opens only after a non-tool message (loop.previtem).
    opens = index > 0 and messages[index - 1].get("role") != "tool"
    closes = index == len(messages) - 1 or messages[index + 1].get("role") != "tool"
    text = (IM_START + "user" if opens else "") + f"\n{TOOL_RESPONSE_OPEN}\n{content}\n{TOOL_RESPONSE_CLOSE}"
    return text + (IM_END + "\n" if closes else "")


def render_segments(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    enable_thinking: bool = True,
) -> list[Segment]:
    """The rendered conversation as segments (see module docstring); ``"".join`` gives `render`'s text."""
    if not messages:
        raise ChatTemplateError(NO_MESSAGES)
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"messages[{index}] must be a dict with 'role', got {type(message).__name__}")
    segments: list[Segment] = []
    if tools:
        segments.append(Segment(_tools_system(tools, messages)))
    elif messages[0].get("role") == "system":
        content = render_content(messages[0].get("content"), "messages[0].content", is_system=True).strip()
        segments.append(Segment(f"{IM_START}system\n{content}{IM_END}\n"))
    query = last_query_index(messages)
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "system":
            if index != 0:
                raise ChatTemplateError(SYSTEM_NOT_FIRST)
        elif role == "user":
            content = render_content(message.get("content"), f"messages[{index}].content").strip()
            segments.append(Segment(f"{IM_START}user\n{content}{IM_END}\n"))
        elif role == "assistant":
            segments.extend(_assistant(message, index, after_query=index > query))
        elif role == "tool":
            segments.append(Segment(_tool(messages, index)))
        else:
            raise ChatTemplateError(f"messages[{index}]: unexpected message role {role!r}")
    if add_generation_prompt:
        think = f"{THINK_OPEN}\n" if enable_thinking else f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"
        segments.append(Segment(f"{IM_START}assistant\n{think}"))
    return segments


def render(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    enable_thinking: bool = True,
) -> str:
    """Render OpenAI-style messages exactly as the Qwen3.5 chat template does (QWEN35.md §6.3).

    Raises `ChatTemplateError` with the template's own messages ("No user query found in messages.",
    "System message must be at the beginning.", "No messages provided.") or naming the malformed field.
    """
    return "".join(s.text for s in render_segments(messages, tools, add_generation_prompt, enable_thinking))
