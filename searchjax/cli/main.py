"""The `searchjax` console script: one subcommand per module listed in COMMAND_MODULES.

Each module exposes `register(subparsers)`, adding its subcommands; each subcommand sets `func(args) -> int`.
Modules are imported when the parser is built, so a broken module fails loudly rather than hiding a command.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Each entry is a module under searchjax.cli with a `register(subparsers)` function.
COMMAND_MODULES = (
    "searchjax.cli.rollout",
    "searchjax.cli.data",
    "searchjax.cli.tokenizer",
    "searchjax.cli.search",
    "searchjax.cli.demo",
    "searchjax.cli.model",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="searchjax", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # The reader went away (`searchjax search ... | head`): not an error of ours. Point stdout at devnull so
        # the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
