"""searchjax: post-train a search agent in JAX — offline world, search index, data, model, rollouts.

Each module of COMMAND_MODULES exposes `register(subparsers)`, adding its subcommands; each subcommand sets
`func(args) -> int`. Modules are imported when the parser is built, so a broken module fails loudly rather than
hiding a command. Every command runs under `run_command` (one-line errors, exit 1) and SIGTERM is turned into
KeyboardInterrupt, so a killed command still removes its temporary outputs and leaves the previous ones intact.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from searchjax import __version__
from searchjax.cli.common import Parser, run_command

# Each entry is a module under searchjax.cli with a `register(subparsers)` function.
COMMAND_MODULES = (
    "searchjax.cli.rollout",
    "searchjax.cli.data",
    "searchjax.cli.tokenizer",
    "searchjax.cli.search",
    "searchjax.cli.demo",
    "searchjax.cli.model",
    "searchjax.cli.eval",
    "searchjax.cli.train",
    "searchjax.cli.reward_model",
    "searchjax.cli.pipeline",
)


EPILOG = ("Run `searchjax COMMAND --help` for a command's options. Exit status: 0 success, 1 failure (one line "
          "`error: ...` on stderr), 2 usage error, 130 interrupted.")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="searchjax", description=__doc__.splitlines()[0].split(": ", 1)[1],
                                     epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"searchjax {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def install_signal_handlers() -> None:
    """SIGTERM behaves as Ctrl-C: cleanup (finally blocks, atomic outputs) runs before the process exits."""
    signal.signal(signal.SIGTERM, _terminate)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    install_signal_handlers()
    try:
        return run_command(args.func)(args)
    except BrokenPipeError:
        # The reader went away (`searchjax search ... | head`): not an error of ours. Point stdout at devnull so
        # the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
