"""The Qwen3.5 chat format: rendering (`render`), parsing generated turns (`parse_assistant`) and tokenizers
(`load_tokenizer`, `train_tokenizer`, `encode_conversation` with its assistant loss mask)."""

from searchjax.chat.parser import ParsedTurn, ToolCall, convert_value, parse_assistant, tool_schemas
from searchjax.chat.template import (
    ChatTemplateError,
    Segment,
    format_argument,
    render,
    render_segments,
    render_tool_call,
)
from searchjax.chat.tokenizer import (
    QWEN35_SPECIAL_TOKENS,
    SpecialIds,
    Tokenizer,
    encode_conversation,
    load_tokenizer,
    train_tokenizer,
)

__all__ = [
    "ChatTemplateError",
    "ParsedTurn",
    "QWEN35_SPECIAL_TOKENS",
    "Segment",
    "SpecialIds",
    "ToolCall",
    "Tokenizer",
    "convert_value",
    "encode_conversation",
    "format_argument",
    "load_tokenizer",
    "parse_assistant",
    "render",
    "render_segments",
    "render_tool_call",
    "tool_schemas",
    "train_tokenizer",
]
