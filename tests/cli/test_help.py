"""CLI help: no internal words, --version, help text on every option, and the README's command list as --help."""

import argparse
import re
from pathlib import Path

import pytest

from searchjax import __version__
from searchjax.cli.main import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"


def _commands(parser, path=()):
    """(command path, parser) for every leaf command."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, sub in subs[0].choices.items():
        yield from _commands(sub, (*path, name))


LEAVES = dict(_commands(build_parser()))


def _options(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


def test_version(cli):
    code, out, _ = cli("--version")
    assert code == 0 and out.strip() == f"searchjax {__version__}"


def test_top_level_help_has_no_internal_words(cli):
    code, out, _ = cli("--help")
    assert code == 0 and "COMMAND_MODULES" not in out and "console script" not in out


@pytest.mark.parametrize("path", sorted(LEAVES), ids=" ".join)
def test_every_option_has_help(path):
    for action in LEAVES[path]._actions:
        assert action.help, (path, action.option_strings or action.dest)


def _readme_commands() -> dict[tuple[str, ...], str]:
    block = README.read_text().split("## Command line", 1)[1].split("```", 2)[1]
    text = re.sub(r"\\\n\s*", " ", block)  # continuation lines
    out = {}
    for line in text.splitlines():
        words = line.split()
        if words[:1] != ["searchjax"] or len(words) < 2 or words[1].startswith("-"):
            continue
        path = next(p for n in (2, 1) if (p := tuple(words[1:1 + n])) in LEAVES)
        out[path] = line
    return out


DATA_COMMANDS = {("data", "synth-qa"), ("data", "rubric"), ("data", "calibrate"), ("data", "sft"), ("data", "public")}


def test_readme_lists_every_command_with_the_options_of_its_help():
    listed = _readme_commands()
    # The commands of the search, data, model, rollout and demo modules; train, eval and the reward-model
    # commands are listed by their own modules' tests.
    mine = {p for p in LEAVES if p[0] in ("demo", "model", "world", "index", "search", "serve-search", "tokenizer",
                                          "rollout", "serve") or p in DATA_COMMANDS}
    assert mine <= set(listed), sorted(mine - set(listed))
    for path in mine:
        line = listed[path]
        written = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", line))
        assert written == _options(LEAVES[path]), (path, written ^ _options(LEAVES[path]))
