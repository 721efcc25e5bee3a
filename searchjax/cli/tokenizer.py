"""`searchjax tokenizer train`: a byte-level BPE with the Qwen3.5 special tokens, saved as tokenizer.json."""

from __future__ import annotations

import argparse
import sys

from searchjax.chat.tokenizer import train_tokenizer


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tokenizer", help="train tokenizers")
    sub = parser.add_subparsers(dest="tokenizer_command", metavar="ACTION")
    sub.required = True
    train = sub.add_parser("train", help="train a byte-level BPE with Qwen3.5's special tokens")
    train.add_argument("--corpus", nargs="+", required=True,
                       help="corpus files: .jsonl with title/text fields (the world corpus) or plain text")  # fmt: skip
    train.add_argument("--vocab-size", type=int, required=True, help="total vocabulary incl. 33 special tokens")
    train.add_argument("--out", required=True, help="output tokenizer.json path")
    train.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    try:
        tok = train_tokenizer(args.corpus, args.vocab_size, args.out)
    except (OSError, ValueError) as e:  # missing corpus, bad line (file:line), vocab too small, unwritable --out
        print(f"error: {e}", file=sys.stderr)
        return 1
    s = tok.special
    print(f"wrote {args.out}: vocab {tok.vocab_size} (asked {args.vocab_size}); "
          f"<|endoftext|>={s.endoftext} <|im_start|>={s.im_start} <|im_end|>={s.im_end} "
          f"<think>={s.think} <tool_call>={s.tool_call}")  # fmt: skip
    return 0
