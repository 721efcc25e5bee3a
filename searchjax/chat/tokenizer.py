"""Tokenizers: load any Hugging Face tokenizer.json, train a byte-level BPE with Qwen3.5's special tokens,
and encode a conversation together with its assistant loss mask.

The trained tokenizer copies Qwen3.5's layout: byte-level BPE over Qwen3.5's pre-tokenisation regex, then the 33
Qwen3.5 added tokens appended in Qwen3.5's order (so ``<|endoftext|>`` is the first id after the learned
vocabulary, as 248044 is in the real model). Unlike Qwen's tokenizer.json it has no NFC normaliser, so
``decode(encode(s)) == s`` for every string.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from searchjax.atomic import atomic_path
from searchjax.chat.template import ChatTemplateError, render, render_segments

# Qwen3.5's added tokens in id order, starting at 248044 (QWEN35.md §6.3).
QWEN35_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>",
    "<|audio_pad|>",
)  # fmt: skip

# Qwen3.5's pre-tokenisation regex (Qwen3's plus \p{M} with letters).
QWEN35_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The chat-format tokens every tokenizer used here must have, by the attribute name of `SpecialIds`.
REQUIRED_TOKENS = {
    "endoftext": "<|endoftext|>",
    "im_start": "<|im_start|>",
    "im_end": "<|im_end|>",
    "tool_call": "<tool_call>",
    "tool_call_end": "</tool_call>",
    "tool_response": "<tool_response>",
    "tool_response_end": "</tool_response>",
    "think": "<think>",
    "think_end": "</think>",
}


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """Ids of the chat-format tokens. ``pad`` is ``<|endoftext|>``, Qwen's pad token."""

    endoftext: int
    im_start: int
    im_end: int
    tool_call: int
    tool_call_end: int
    tool_response: int
    tool_response_end: int
    think: int
    think_end: int
    pad: int

    @property
    def stop_ids(self) -> tuple[int, int]:
        """Generation stops on ``<|im_end|>`` (end of turn) and ``<|endoftext|>`` (eos), QWEN35.md §6.3."""
        return (self.im_end, self.endoftext)


class Tokenizer:
    """A `tokenizers.Tokenizer` with the chat special ids; encode never adds tokens, decode keeps specials."""

    def __init__(self, hf: tokenizers.Tokenizer, source: str = "<memory>"):
        missing = [tok for tok in REQUIRED_TOKENS.values() if hf.token_to_id(tok) is None]
        if missing:
            raise ValueError(f"{source}: tokenizer lacks the chat special tokens {missing}")
        ids = {name: hf.token_to_id(tok) for name, tok in REQUIRED_TOKENS.items()}
        self.hf = hf
        self.source = source
        self.special = SpecialIds(pad=ids["endoftext"], **ids)

    @property
    def vocab_size(self) -> int:
        """Number of ids including added tokens (the embedding needs at least this many rows)."""
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in it become their single ids."""
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens included."""
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def save(self, path: str | os.PathLike) -> None:
        """Write tokenizer.json atomically (a temporary sibling renamed over `path`)."""
        try:
            with atomic_path(path) as tmp:
                self.hf.save(os.fspath(tmp))
        except Exception as err:  # the Rust writer raises a bare Exception (missing folder, a directory, ...)
            raise OSError(f"cannot write {os.fspath(path)}: {err}") from err


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load a Hugging Face ``tokenizer.json`` (a file, or a directory holding one)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no tokenizer.json at {path}")
    try:
        hf = tokenizers.Tokenizer.from_file(path)
    except Exception as err:  # the Rust loader raises a bare Exception on malformed files
        raise ValueError(f"{path}: not a valid tokenizer.json ({err})") from err
    return Tokenizer(hf, source=path)


def _utf8_lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of a file's lines; a byte that is not UTF-8 is a ValueError naming file:line."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not UTF-8 (byte 0x{raw[err.start]:02x} at column "
                                 f"{err.start + 1})") from None


def iter_corpus_texts(paths: Iterable[str | os.PathLike]) -> Iterator[str]:
    """Texts of corpus files: ``.jsonl`` lines give ``title`` and ``text`` fields, or, for a conversation row
    (a ``messages`` list, as `searchjax data sft` writes them), the conversation rendered with the chat template
    and the search_web tool, as the SFT stage renders it (rows of split ``dev`` are left out); other files give
    lines. Training on rendered trajectories gives the template and the tool-call syntax few tokens each."""
    for path in paths:
        path = os.fspath(path)
        if not path.endswith(".jsonl"):
            yield from (line for _, line in _utf8_lines(path))
            continue
        for lineno, line in _utf8_lines(path):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({err.msg})") from err
            if isinstance(record, dict) and isinstance(record.get("messages"), list):
                if record.get("split") != "dev":
                    yield _rendered_conversation(record["messages"], f"{path}:{lineno}")
                continue
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"{path}:{lineno}: expected an object with a string 'text' field")
            if not isinstance(record.get("title", ""), str):
                raise ValueError(f"{path}:{lineno}: field 'title' must be a string")
            yield f"{record.get('title', '')}\n{record['text']}\n"


def _rendered_conversation(messages: list, where: str) -> str:
    from searchjax.search import SEARCH_WEB_TOOL  # here: importing chat does not load the search package

    try:
        return render(messages, [SEARCH_WEB_TOOL], add_generation_prompt=False) + "\n"
    except ChatTemplateError as err:
        raise ValueError(f"{where}: conversation the chat template refuses: {err}") from err


def new_bpe_tokenizer() -> tokenizers.Tokenizer:
    """An untrained byte-level BPE with Qwen3.5's pre-tokeniser and decoder (no normaliser)."""
    hf = tokenizers.Tokenizer(models.BPE())
    split = pre_tokenizers.Split(tokenizers.Regex(QWEN35_SPLIT_REGEX), behavior="isolated")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    hf.decoder = decoders.ByteLevel()
    return hf


def _split_at_specials(text: str) -> list[str]:
    """`text` cut around every special-token string it holds (the pieces between them)."""
    pieces = [text]
    for special in QWEN35_SPECIAL_TOKENS:
        pieces = [part for piece in pieces for part in piece.split(special)]
    return pieces


def train_tokenizer(
    corpus: Sequence[str | os.PathLike],
    vocab_size: int,
    out: str | os.PathLike | None = None,
    phrases: Sequence[str] = (),
) -> Tokenizer:
    """Train a byte-level BPE on ``corpus`` files (see `iter_corpus_texts`) and save it to ``out``.

    ``vocab_size`` counts everything: 256 byte tokens, the learned merges, the ``phrases`` and the 33 Qwen3.5
    added tokens, which take the last ids. A small corpus may learn fewer merges than asked (the returned
    tokenizer's `vocab_size` says how many); a corpus with no text is a ValueError, as it could learn none.

    ``phrases``: fixed strings that become one token each (non-special added tokens, matched in the raw text
    before the BPE, decoded as themselves; a phrase holding a special token is split around it), e.g. the constant blocks of every prompt's system turn
    (`searchjax.data.prompts.prompt_phrases`). A small vocabulary spells a ~1,900-character system turn in ~780
    tokens that every training example pays for; as phrases it takes a few. They go before the special tokens,
    so ``<|endoftext|>`` stays the first id after the tokens the text is spelled with.
    """
    for phrase in phrases:
        if not isinstance(phrase, str) or not phrase.strip():
            raise ValueError(f"a phrase must be a non-empty string, got {phrase!r}")
    phrases = list(dict.fromkeys(p for phrase in phrases for p in _split_at_specials(phrase) if p.strip()))
    floor = 256 + len(phrases) + len(QWEN35_SPECIAL_TOKENS) + 1
    if vocab_size < floor:
        raise ValueError(f"vocab_size must be at least {floor} (256 bytes + {len(phrases)} phrases + specials + 1), "
                         f"got {vocab_size}")
    for path in corpus:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"corpus file not found: {path}")
    out_dir = os.path.dirname(os.fspath(out)) if out is not None else ""
    if out_dir and not os.path.isdir(out_dir):
        raise FileNotFoundError(f"output folder {out_dir} does not exist (for {out})")
    hf = new_bpe_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(phrases) - len(QWEN35_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    chars = 0

    def texts() -> Iterator[str]:
        nonlocal chars
        for text in iter_corpus_texts(corpus):
            chars += len(text.strip())
            yield text

    hf.train_from_iterator(texts(), trainer=trainer)
    if chars == 0:
        raise ValueError(f"the corpus {', '.join(map(os.fspath, corpus))} holds no text to learn merges from")
    hf.add_tokens([tokenizers.AddedToken(p, special=False, normalized=False) for p in phrases])
    hf.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in QWEN35_SPECIAL_TOKENS])
    tok = Tokenizer(hf, source="trained")
    if out is not None:
        tok.save(out)
        tok.source = os.fspath(out)
    return tok


def encode_conversation(
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Tokenizer,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    enable_thinking: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of ``render(messages, …)`` and a loss mask, both int32 ``[T]``.

    ``mask[t] = 1`` exactly on the tokens of each assistant turn after ``<|im_start|>assistant\\n`` up to and
    including its ``<|im_end|>`` (for turns after the last user query that includes the ``<think>`` block);
    0 on system, user, tool-response tokens, the newline between turns, the generation prompt and assistant turns
    with ``weight`` 0 (context shown to the model, not a target).

    Segments are encoded one by one. Every segment boundary sits next to a special token or between
    ``assistant\\n`` and trimmed (non-whitespace-initial) content, where no pre-token can straddle it, so the
    concatenation equals ``encode(render(...))``; this is checked, and a mismatch raises ValueError.
    """
    segments = render_segments(messages, tools, add_generation_prompt, enable_thinking)
    pieces = tokenizer.encode_batch([s.text for s in segments])
    ids = np.fromiter((i for p in pieces for i in p), dtype=np.int32)
    mask = np.fromiter((int(s.trainable) for s, p in zip(segments, pieces) for _ in p), dtype=np.int32)
    whole = tokenizer.encode("".join(s.text for s in segments))
    if whole != ids.tolist():
        at = next((k for k, (a, b) in enumerate(zip(whole, ids.tolist())) if a != b), min(len(whole), len(ids)))
        raise ValueError(f"{tokenizer.source}: per-turn encoding differs from encode(render(...)) at token {at}")
    return ids, mask
