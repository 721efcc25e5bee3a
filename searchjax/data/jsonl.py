"""JSONL reading and writing with row-level error reporting.

A malformed row either stops the read with `file:line: reason` (the default, `on_error="raise"`) or, when the
caller's config says so (`on_error="skip"`), is skipped and counted in a `ReadSummary`, whose `reasons` list
names every skipped row: nothing is ever dropped silently.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from searchjax.atomic import atomic_path

OnError = Literal["raise", "skip"]


class DataError(ValueError):
    """Bad input data; the message names the file, the line and what is wrong."""


@dataclasses.dataclass
class ReadSummary:
    """What a read kept and skipped; `skipped` holds one "file:line: reason" string per skipped row."""

    path: str
    kept: int = 0
    skipped: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kept": self.kept, "skipped": len(self.skipped), "reasons": list(self.skipped)}


Validator = Callable[[dict[str, Any]], None]


def _check_on_error(on_error: str) -> None:
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")


def iter_jsonl(
    path: str | Path,
    *,
    validate: Validator | None = None,
    on_error: OnError = "raise",
    summary: ReadSummary | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the JSON objects of `path`, one per non-blank line.

    `validate(row)` may raise ValueError/KeyError/TypeError with a reason; that reason, like a JSON syntax
    error or a row that is not an object, becomes `DataError("file:line: reason")` or a counted skip.
    """
    _check_on_error(on_error)
    path = Path(path)
    summary = summary if summary is not None else ReadSummary(str(path))
    with open_data(path, binary=True) as handle:
        for lineno, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                row = _parse_row(raw.decode("utf-8"), validate)  # a bad byte is this line's error
            except (ValueError, KeyError, TypeError) as e:
                reason = f"{path}:{lineno}: {_reason(e)}"
                if on_error == "raise":
                    raise DataError(reason) from None
                summary.skipped.append(reason)
                continue
            summary.kept += 1
            yield row


def open_data(path: Path, *, binary: bool = False, newline: str | None = None):
    """Open a data file (UTF-8 text, or bytes); a missing file, a directory or an unreadable file is a
    `DataError` naming the path instead of an OS traceback."""
    try:
        if binary:
            return path.open("rb")
        return path.open(encoding="utf-8", newline=newline)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None


def _reason(e: Exception) -> str:
    if isinstance(e, KeyError):
        return f"missing field {e.args[0]!r}"
    return str(e)


def _parse_row(line: str, validate: Validator | None) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    if validate is not None:
        validate(row)
    return row


def read_jsonl(
    path: str | Path, *, validate: Validator | None = None, on_error: OnError = "raise"
) -> tuple[list[dict[str, Any]], ReadSummary]:
    """Read every row of `path` (see `iter_jsonl`); returns the rows and the summary of kept/skipped rows."""
    summary = ReadSummary(str(path))
    rows = list(iter_jsonl(path, validate=validate, on_error=on_error, summary=summary))
    return rows, summary


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write `rows` as UTF-8 JSONL (one object per line, keys in insertion order); returns the row count.

    Atomic: the rows go to a temporary sibling renamed over `path` once the last one is written, so a failure
    or a kill while `rows` is still being produced leaves the previous `path` intact and no partial file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def check_fields(row: dict[str, Any], fields: Iterable[str], *, exact: bool = True) -> None:
    """Raise naming the fields of `fields` that `row` lacks (and, when `exact`, the ones it has besides)."""
    fields = list(fields)
    missing = [f for f in fields if f not in row]
    extra = sorted(set(row) - set(fields)) if exact else []
    problems = []
    if missing:
        problems.append(f"missing field{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
    if extra:
        problems.append(f"unexpected field{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))}")
    if problems:
        raise ValueError("; ".join(problems))


def require(row: dict[str, Any], field: str, kind: type | tuple[type, ...]) -> Any:
    """The value of `row[field]`, checked to be of `kind`; raises KeyError/TypeError naming the field."""
    if field not in row:
        raise KeyError(field)
    value = row[field]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise TypeError(f"field {field!r}: expected {names}, got {type(value).__name__} {value!r:.60}")
    return value
