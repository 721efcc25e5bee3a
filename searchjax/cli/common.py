"""What every command shares: one-line errors with exit status 1, and checks of inputs and outputs made before
any long work (loading a model, building an index).

Exit status: 0 success, 1 any failure (bad input, missing file, failed search, ...), 2 argparse usage errors
only (an unknown option, or an argparse `type=` check such as `check_port` or `positive_int`), 130 when
interrupted (Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

from searchjax.search.types import SearchError


class CLIError(Exception):
    """A failure the command reports as its one line `error: <message>` (exit status 1)."""


def _known_errors() -> tuple[type[BaseException], ...]:
    # ConfigError, DataError, CheckpointError, ChatTemplateError, ShardingError and ModelReplyError are
    # ValueErrors; FileNotFoundError and PermissionError are OSErrors. ChatClientError is a RuntimeError, so
    # it is named (a bare RuntimeError is a bug and keeps its traceback).
    from searchjax.rewards.rubrics import ChatClientError

    return CLIError, ValueError, OSError, SearchError, ChatClientError


def error_line(e: BaseException) -> str:
    """The one line that reports `e`: OSErrors as `path: reason`, every message folded onto one line."""
    if isinstance(e, OSError) and e.strerror and e.filename is not None:
        text = f"{e.filename}: {e.strerror}"
    else:
        text = str(e) or type(e).__name__
    return " ".join(text.split())


def fail(message: str) -> int:
    print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    return 1


def run_command(func: Callable[[argparse.Namespace], int | None]) -> Callable[[argparse.Namespace], int]:
    """Wrap a command: the project's known error types become `error: <one line>` on stderr and status 1; an
    interrupt becomes `interrupted` and status 130. Outputs written with searchjax.atomic are then left as
    they were before the command ran."""

    @functools.wraps(func)
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return int(func(args) or 0)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr, flush=True)
            return 130
        except _known_errors() as e:
            return fail(error_line(e))

    return wrapped


def show_progress() -> bool:
    """Progress bars go to stderr only when it is a terminal (not into logs, pipes or captured output)."""
    return sys.stderr.isatty()


def check_port(value: str) -> int:
    """argparse type: a TCP port, 0..65535 (0 lets the system pick a free one, which the server prints)."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535 (0 picks a free one), got {port}")
    return port


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def float_in(lo: float, hi: float, *, lo_open: bool = False) -> Callable[[str], float]:
    """argparse type: a float in [lo, hi] ((lo, hi] with `lo_open`)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not ((lo < value) if lo_open else (lo <= value)) or not value <= hi:
            raise argparse.ArgumentTypeError(f"expected a number in {'(' if lo_open else '['}{lo}, {hi}], got {text}")
        return value

    return parse


def check_output(path: str | os.PathLike, overwrite: bool, kind: str = "file", flag: str = "--out") -> Path:
    """Validate an output location before any work: its parent directory exists and is writable, it is not a
    directory when a file is wanted (nor a file when a directory is), and an existing one is refused unless
    `overwrite` (the command then replaces it whole)."""
    if kind not in ("file", "dir"):
        raise ValueError(f"check_output: kind must be 'file' or 'dir', got {kind!r}")
    path = Path(path)
    parent = path.parent
    if not parent.is_dir():
        raise CLIError(f"{flag} {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CLIError(f"{flag} {path}: the directory {parent} is not writable")
    if path.is_dir() and kind == "file":
        raise CLIError(f"{flag} {path}: is a directory, expected a file path")
    if path.exists() and not path.is_dir() and kind == "dir":
        raise CLIError(f"{flag} {path}: is a file, expected a directory path")
    if path.exists() and not overwrite:
        raise CLIError(f"{flag} {path}: exists (pass --overwrite to replace it)")
    return path


def check_input_file(path: str | os.PathLike, what: str) -> Path:
    """An existing, readable regular file, or CLIError naming `what` (e.g. "--prompts") and the path."""
    path = Path(path)
    if not path.exists():
        raise CLIError(f"{what} {path}: no such file")
    if path.is_dir():
        raise CLIError(f"{what} {path}: is a directory, expected a file")
    if not os.access(path, os.R_OK):
        raise CLIError(f"{what} {path}: not readable")
    return path


def check_input_dir(path: str | os.PathLike, what: str, *, needs: tuple[str, ...] = ()) -> Path:
    """An existing directory holding every file in `needs`, or CLIError naming `what` and what is missing."""
    path = Path(path)
    if not path.exists():
        raise CLIError(f"{what} {path}: no such directory")
    if not path.is_dir():
        raise CLIError(f"{what} {path}: is a file, expected a directory")
    missing = [name for name in needs if not (path / name).exists()]
    if missing:
        raise CLIError(f"{what} {path}: missing {', '.join(missing)}")
    return path


SERVICE_WAIT_S = 5.0  # how long an --index URL may take to answer GET /health (a service still starting)
INDEX_HELP = "a tantivy index directory (`searchjax index build`) or a search service URL http://HOST:PORT " \
             "(`searchjax serve-search`)"


def open_search_backend(value: str, flag: str = "--index"):
    """The search backend named by an --index value: a service URL (checked to answer GET /health within
    SERVICE_WAIT_S) or a tantivy index directory; CLIError/SearchError naming `flag` otherwise. Cheap next to loading
    a model, so commands call it first."""
    from searchjax.search import HttpBackend, TantivyBackend, wait_until_serving

    if "://" in value:
        try:
            backend = HttpBackend(value)
        except ValueError as e:
            raise CLIError(f"{flag} {value}: {e}") from None
        try:
            wait_until_serving(value.rstrip("/"), timeout_s=SERVICE_WAIT_S)
        except SearchError as e:
            raise CLIError(f"{flag}: {e}") from None
        return backend
    check_input_dir(value, flag)
    return TantivyBackend(value)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends "(default: X)" to an option's help when it has a default worth showing and does not say it;
    descriptions and epilogs keep their line breaks (format tables)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS) and not action.required
        if shown and action.option_strings and "default" not in text:
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """The CLI's parser: defaults shown in --help, and a usage error as one line (status 2)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def add_overwrite(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing output whole (default: refuse to touch it)")
