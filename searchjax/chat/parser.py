"""Parse one generated assistant turn in the Qwen3.5 format: reasoning, content and Qwen3-Coder XML tool calls.

The generation prompt ends with ``<think>\\n`` (thinking on), so the text normally reads
``REASONING</think>\\n\\nCONTENT\\n\\n<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n
</function>\\n</tool_call><|im_end|>``. Anything a model may emit is accepted: malformed output becomes entries in
``errors``, never an exception. Parameter values lose exactly one leading and one trailing newline (the ones the
template adds) and are converted by the tool's JSON-schema type.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from searchjax.chat.template import (
    IM_END,
    IM_START,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
)

ENDOFTEXT = "<|endoftext|>"
FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAM_OPEN = "<parameter="
PARAM_CLOSE = "</parameter>"
# Tags that must not appear in free text (content, reasoning, or between parts of a call).
STRAY_TAGS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, FUNCTION_OPEN, FUNCTION_CLOSE, PARAM_OPEN, PARAM_CLOSE,
              THINK_OPEN, THINK_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One ``<tool_call>`` block. ``errors`` non-empty means the call must not be executed."""

    name: str
    arguments: dict[str, Any]
    errors: list[str]
    raw: str

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    """A parsed assistant turn.

    ``tool_calls`` lists every ``<tool_call>`` block in order, valid or not (each carries its own ``errors``);
    ``errors`` holds every problem found, turn-level (unclosed ``<think>``, text after a call, …) and per call
    (prefixed ``tool call K:``). ``reasoning`` is None when the text has no thinking block.
    """

    content: str
    reasoning: str | None
    tool_calls: list[ToolCall]
    errors: list[str]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def valid_calls(self) -> list[ToolCall]:
        return [c for c in self.tool_calls if c.ok]


def rejection_response(errors: Sequence[str]) -> str:
    """The tool response a rejected (malformed) call gets: the parser's errors, so the model can correct the call.

    The agent answers every rejected call with it (searchjax.rollout.agent); SFT recovery examples show the same
    text after a malformed turn (searchjax.data.sft.with_recovery)."""
    return "Error: malformed tool call: " + "; ".join(errors)


def tool_schemas(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
    """``{name: parameters schema}`` from OpenAI-style tools (``{"type": "function", "function": {...}}`` or bare)."""
    if tools is None:
        return None
    schemas: dict[str, dict[str, Any]] = {}
    for k, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ValueError(f"tools[{k}]: expected {{'function': {{'name': str, 'parameters': {{...}}}}}}")
        params = fn.get("parameters")
        params = {} if params is None else params
        if not isinstance(params, Mapping):
            raise ValueError(f"tools[{k}] ({fn['name']}): 'parameters' must be a JSON-schema object")
        properties = params.get("properties") or {}
        if not isinstance(properties, Mapping) or not all(isinstance(v, Mapping) for v in properties.values()):
            raise ValueError(f"tools[{k}] ({fn['name']}): 'properties' must map names to JSON schemas")
        schemas[fn["name"]] = dict(params)
    return schemas


def _stray_tags(text: str, where: str) -> list[str]:
    return [f"unexpected {tag} in {where}" for tag in STRAY_TAGS if tag in text]


def _cut_at_stop(text: str) -> tuple[str, list[str]]:
    """Text before the first ``<|im_end|>``/``<|endoftext|>``; a new ``<|im_start|>`` also ends the turn."""
    errors = []
    stops = [p for p in (text.find(IM_END), text.find(ENDOFTEXT), text.find(IM_START)) if p >= 0]
    if not stops:
        return text, errors
    cut = min(stops)
    tail = text[cut:]
    if tail.startswith(IM_START):
        errors.append("unexpected <|im_start|>: the turn opened a new message")
    else:
        stop = IM_END if tail.startswith(IM_END) else ENDOFTEXT
        if tail[len(stop):].strip():
            errors.append(f"text after {stop}")
    return text[:cut], errors


def _split_thinking(text: str, thinking: bool) -> tuple[str | None, str, list[str]]:
    """(reasoning, rest, errors). With ``thinking`` the prompt already opened ``<think>``."""
    errors: list[str] = []
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        if thinking:
            errors.append("duplicate <think>: the prompt already opened the thinking block")
        text, thinking = stripped[len(THINK_OPEN):], True
    if not thinking:
        return None, text, errors
    close = text.find(THINK_CLOSE)
    if close < 0:
        errors.append("unclosed <think>: no </think> in the output")
        reasoning, rest = text, ""
    else:
        reasoning, rest = text[:close], text[close + len(THINK_CLOSE):]
    errors += [e.replace("unexpected", "nested") for e in _stray_tags(reasoning, "the thinking block")]
    return reasoning.strip(), rest, errors


def parse_assistant(
    text: str, tools: Sequence[Mapping[str, Any]] | None = None, *, thinking: bool = True
) -> ParsedTurn:
    """Parse the generated text of one assistant turn (see module docstring).

    Args:
      text: what the model generated after the generation prompt, optionally ending in ``<|im_end|>``.
      tools: the tools offered (OpenAI style); given, calls are checked (known function, known and required
        parameters, non-empty required strings, enum) and values converted by type. Without tools values
        stay strings and only the syntax is checked.
      thinking: whether the generation prompt ended inside ``<think>`` (``enable_thinking=True``).
    """
    schemas = tool_schemas(tools)
    text, errors = _cut_at_stop(text)
    reasoning, rest, think_errors = _split_thinking(text, thinking)
    errors += think_errors
    first = rest.find(TOOL_CALL_OPEN)
    content = (rest if first < 0 else rest[:first]).strip()
    errors += _stray_tags(content, "content")
    calls: list[ToolCall] = []
    pos = first
    while pos >= 0:
        call, pos, gap_errors = _next_call(rest, pos, schemas)
        call_errors = [f"tool call {len(calls)}: {e}" for e in call.errors]
        calls.append(call)
        errors += call_errors + gap_errors
    return ParsedTurn(content=content, reasoning=reasoning, tool_calls=calls, errors=errors)


def _next_call(rest: str, pos: int, schemas: dict | None) -> tuple[ToolCall, int, list[str]]:
    """Parse the block opening at ``pos``; returns it, the next block's start (-1 if none) and gap errors."""
    start = pos + len(TOOL_CALL_OPEN)
    close = rest.find(TOOL_CALL_CLOSE, start)
    reopen = rest.find(TOOL_CALL_OPEN, start)
    if close < 0 or 0 <= reopen < close:
        end = reopen if reopen >= 0 else len(rest)
        name, args, errs = _parse_body(rest[start:end], schemas)
        errs.insert(0, "unclosed <tool_call>" if reopen < 0 else "nested <tool_call> inside <tool_call>")
        return ToolCall(name, args, errs, rest[pos:end]), reopen, []
    name, args, errs = _parse_body(rest[start:close], schemas)
    after = close + len(TOOL_CALL_CLOSE)
    following = rest.find(TOOL_CALL_OPEN, after)
    gap = rest[after:] if following < 0 else rest[after:following]
    gap_errors = []
    if gap.strip():
        where = "after the last tool call" if following < 0 else "between tool calls"
        gap_errors.append(f"unexpected text {where}: {gap.strip()[:60]!r}")
    return ToolCall(name, args, errs, rest[pos:after]), following, gap_errors


def _parse_body(body: str, schemas: dict | None) -> tuple[str, dict[str, Any], list[str]]:
    """(name, arguments, errors) of the text inside ``<tool_call>…</tool_call>``."""
    open_at = body.find(FUNCTION_OPEN)
    if open_at < 0:
        return "", {}, ["missing <function=NAME>"]
    errors = [f"unexpected text before <function=…>: {body[:open_at].strip()[:60]!r}"] if body[:open_at].strip() else []
    name_end = body.find(">", open_at)
    name = body[open_at + len(FUNCTION_OPEN): name_end if name_end >= 0 else len(body)].strip()
    if name_end < 0 or "\n" in name or not name:
        return name.split("\n")[0], {}, errors + ["malformed <function=NAME> tag"]
    close = body.find(FUNCTION_CLOSE, name_end)
    if close < 0:
        errors.append("unclosed <function=…>")
        close = len(body)
    elif body[close + len(FUNCTION_CLOSE):].strip():
        errors.append(f"unexpected text after </function>: {body[close + len(FUNCTION_CLOSE):].strip()[:60]!r}")
    inner = body[name_end + 1: close]
    if FUNCTION_OPEN in inner:
        errors.append("nested or duplicate <function=…>")
    raw, param_errors = _parse_params(inner)
    errors += param_errors
    if schemas is None:
        return name, raw, errors
    if name not in schemas:
        return name, raw, errors + [f"unknown function {name!r} (known: {', '.join(sorted(schemas)) or 'none'})"]
    args, schema_errors = convert_arguments(raw, schemas[name])
    return name, args, errors + schema_errors


def _parse_params(inner: str) -> tuple[dict[str, str], list[str]]:
    """Raw string values of ``<parameter=K>\\nV\\n</parameter>`` blocks; text between blocks is an error."""
    values: dict[str, str] = {}
    errors: list[str] = []
    pos = 0
    while True:
        open_at = inner.find(PARAM_OPEN, pos)
        gap = inner[pos: open_at if open_at >= 0 else len(inner)]
        if gap.strip():
            errors.append(f"unexpected text between parameters: {gap.strip()[:60]!r}")
        if open_at < 0:
            return values, errors
        name_end = inner.find(">", open_at)
        close = inner.find(PARAM_CLOSE, open_at)
        nxt = inner.find(PARAM_OPEN, open_at + len(PARAM_OPEN))
        if name_end < 0 or close < 0 or 0 <= nxt < close or close < name_end:
            return values, errors + ["unclosed or malformed <parameter=…>"]
        key = inner[open_at + len(PARAM_OPEN): name_end].strip()
        value = inner[name_end + 1: close]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        if not key or "\n" in key:
            errors.append("malformed <parameter=NAME> tag")
        elif key in values:
            errors.append(f"duplicate parameter {key!r}")
        else:
            values[key] = value
        pos = close + len(PARAM_CLOSE)


def _finite_json(text: str) -> Any:
    """``json.loads`` that refuses NaN and ±Infinity (no tool argument needs them)."""
    return json.loads(text, parse_constant=_reject_constant)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


_PARSERS = {
    "string": lambda s: s,
    "integer": lambda s: _typed(_finite_json(s), int),
    "number": lambda s: _typed(_finite_json(s), (int, float)),
    "boolean": lambda s: {"true": True, "false": False}[s.strip().lower()],
    "null": lambda s: {"null": None, "none": None}[s.strip().lower()],
    "object": lambda s: _typed(_finite_json(s), dict),
    "array": lambda s: _typed(_finite_json(s), list),
}


def _typed(value: Any, kind: type | tuple[type, ...]) -> Any:
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"got {type(value).__name__}")
    return value


def convert_value(raw: str, schema: Mapping[str, Any]) -> Any:
    """Convert a raw parameter string by its JSON-schema ``type`` (or list of types); ValueError if none fits."""
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    if not kinds:
        return raw
    for kind in kinds:
        parse = _PARSERS.get(kind)
        if parse is None:
            raise ValueError(f"unsupported schema type {kind!r}")
        try:
            value = parse(raw if kind == "string" else raw.strip())
        except (ValueError, KeyError, RecursionError):
            continue
        if "enum" in schema and value not in schema["enum"]:
            raise ValueError(f"{value!r} is not one of {schema['enum']}")
        return value
    raise ValueError(f"{raw[:60]!r} is not of type {' or '.join(kinds)}")


def convert_arguments(raw: Mapping[str, str], schema: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Typed arguments and errors: unknown or missing-required parameters, empty required strings, bad types."""
    properties = schema.get("properties") or {}
    required = list(schema.get("required") or [])
    args: dict[str, Any] = {}
    errors: list[str] = []
    for key, value in raw.items():
        if key not in properties:
            errors.append(f"unknown parameter {key!r} (expected one of {sorted(properties)})")
            continue
        try:
            args[key] = convert_value(value, properties[key])
        except ValueError as err:
            errors.append(f"parameter {key!r}: {err}")
            continue
        if key in required and isinstance(args[key], str) and not args[key].strip():
            errors.append(f"parameter {key!r} is empty")
    errors += [f"missing required parameter {key!r}" for key in required if key not in raw]
    return args, errors
