"""`searchjax tokenizer train`: a byte-level BPE with the Qwen3.5 special tokens, saved as tokenizer.json."""

from __future__ import annotations

import argparse
import sys

from searchjax.cli.common import add_overwrite, check_input_file, check_output, int_at_least, run_command


def register(subparsers: argparse._SubParsersAction) -> None:
    from searchjax.chat.tokenizer import QWEN35_SPECIAL_TOKENS

    parser = subparsers.add_parser("tokenizer", help="train tokenizers")
    sub = parser.add_subparsers(dest="tokenizer_command", metavar="ACTION")
    sub.required = True
    train = sub.add_parser("train", help="train a byte-level BPE with Qwen3.5's special tokens")
    train.add_argument("--corpus", nargs="+", required=True,
                       help="corpus files: .jsonl with title/text fields (the world corpus), .jsonl conversations "
                            "(`data sft` output: rendered with the chat template, split dev left out) or plain text")
    floor = 256 + len(QWEN35_SPECIAL_TOKENS) + 1
    train.add_argument("--vocab-size", type=int_at_least(floor), required=True,
                       help=f"total vocabulary incl. 256 bytes and {len(QWEN35_SPECIAL_TOKENS)} special tokens "
                            f"(at least {floor}; a small corpus may learn fewer ids, which is reported)")
    train.add_argument("--prompt-phrases", action="store_true",
                       help="make each constant block of the prompts' system turn one token (the chat template's "
                            "search_web tool block, the system prompt, the budget sentence around its number): "
                            "with a small vocabulary they are ~780 of every example's tokens otherwise")
    train.add_argument("--out", required=True, help="output tokenizer.json path")
    add_overwrite(train)
    train.set_defaults(func=_train)


@run_command
def _train(args: argparse.Namespace) -> int:
    from searchjax.chat.tokenizer import train_tokenizer
    from searchjax.data.prompts import prompt_phrases

    corpus = [check_input_file(path, "--corpus") for path in args.corpus]
    out = check_output(args.out, args.overwrite)
    tok = train_tokenizer(corpus, args.vocab_size, out, phrases=prompt_phrases() if args.prompt_phrases else ())
    s = tok.special
    print(f"wrote {out}: vocab {tok.vocab_size} (asked {args.vocab_size}); "
          f"<|endoftext|>={s.endoftext} <|im_start|>={s.im_start} <|im_end|>={s.im_end} "
          f"<think>={s.think} <tool_call>={s.tool_call}")  # fmt: skip
    if tok.vocab_size < args.vocab_size:
        print(f"warning: the corpus gave only {tok.vocab_size:,} ids of the {args.vocab_size:,} asked "
              "(it has too few distinct byte pairs to merge); use a larger corpus for a larger vocabulary",
              file=sys.stderr)
    return 0
