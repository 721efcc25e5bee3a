"""Loaders for public QA sets in their published file formats, unified into one QA record.

Formats (the files as their authors publish them):
  simpleqa     CSV with columns metadata, problem, answer (metadata: a Python-literal dict with topic,
               answer_type, urls)
  frames       TSV with columns Prompt, Answer, wiki_links (a Python-literal list), plus reasoning_types and
               wikipedia_link_* columns kept as metadata
  bamboogle    CSV with columns Question, Answer
  sealqa       Parquet (or JSONL) with question, answer and metadata columns (urls, topic, freshness, ...)
  webwalkerqa  JSONL (or a JSON list) of {Question, Answer, Root_Url, Info}
  deepdive     Parquet (or JSONL) with id, question, answer, conversations

Every loader returns unified records {id, kind="qa", question, answer, aliases, source, split, meta} and a
`ReadSummary`; a missing file, a missing column or a corrupt row raises `DataError` naming file and line (rows of
Parquet files are named by row index), or with on_error="skip" is skipped and counted. `quality_filter` then
applies the write-up's quality filtering (RECIPE.md §3.1 "public baseline mix") and counts rejections by reason.
"""

from __future__ import annotations

import ast
import csv
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from searchjax.data.jsonl import DataError, OnError, ReadSummary, iter_jsonl, open_data

FORMATS = ("simpleqa", "frames", "bamboogle", "sealqa", "webwalkerqa", "deepdive")
RowFn = Callable[[dict[str, Any]], tuple[str, str, list[str], dict[str, Any]]]


def _literal(text: str, kind: type, field: str) -> Any:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ValueError(f"column {field!r}: not a Python literal {kind.__name__}: {text[:80]!r}") from None
    if not isinstance(value, kind):
        raise ValueError(f"column {field!r}: expected a {kind.__name__}, got {type(value).__name__}")
    return value


def _text(row: dict[str, Any], field: str) -> str:
    if field not in row or row[field] is None:
        raise KeyError(field)
    value = row[field]
    if not isinstance(value, str):
        raise TypeError(f"field {field!r}: expected a string, got {type(value).__name__}")
    return value.strip()


def _simpleqa(row):
    meta = _literal(row["metadata"], dict, "metadata")
    return _text(row, "problem"), _text(row, "answer"), [], meta


def _frames(row):
    links = _literal(row["wiki_links"], list, "wiki_links") if row.get("wiki_links") else []
    meta = {"wiki_links": links, "reasoning_types": row.get("reasoning_types", "")}
    return _text(row, "Prompt"), _text(row, "Answer"), [], meta


def _bamboogle(row):
    return _text(row, "Question"), _text(row, "Answer"), [], {}


def _sealqa(row):
    meta = {k: v for k, v in row.items() if k not in ("question", "answer") and _jsonable(v)}
    return _text(row, "question"), _text(row, "answer"), [], meta


def _webwalker(row):
    info = row.get("Info") or {}
    if not isinstance(info, dict):
        raise TypeError(f"field 'Info': expected an object, got {type(info).__name__}")
    return _text(row, "Question"), _text(row, "Answer"), [], {"root_url": row.get("Root_Url"), **info}


def _deepdive(row):
    return _text(row, "question"), _text(row, "answer"), [], {"source_id": row.get("id")}


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


_COLUMNS = {
    "simpleqa": ("metadata", "problem", "answer"), "frames": ("Prompt", "Answer"),
    "bamboogle": ("Question", "Answer"), "sealqa": ("question", "answer"),
    "webwalkerqa": ("Question", "Answer"), "deepdive": ("question", "answer"),
}
_ROW_FNS: dict[str, RowFn] = {
    "simpleqa": _simpleqa, "frames": _frames, "bamboogle": _bamboogle, "sealqa": _sealqa,
    "webwalkerqa": _webwalker, "deepdive": _deepdive,
}


def _delimited_rows(path: Path, delimiter: str, columns: tuple[str, ...]) -> Iterator[tuple[int, dict]]:
    with open_data(path, newline="") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        try:
            yield from _checked_rows(reader, path, columns)
        except UnicodeDecodeError as e:  # decoded a block at a time: the line is where the bad block starts
            raise DataError(f"{path}: not UTF-8 text at or after line {reader.line_num + 1} ({e.reason})") from None
        except csv.Error as e:
            raise DataError(f"{path}:{reader.line_num}: malformed {_describe_delimiter(delimiter)} ({e})") from None


def _describe_delimiter(delimiter: str) -> str:
    return "TSV" if delimiter == "\t" else "CSV"


def _checked_rows(reader: csv.DictReader, path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, Any]]:
    header = reader.fieldnames or []
    missing = [c for c in columns if c not in header]
    if missing:
        raise DataError(f"{path}:1: missing column(s) {missing}; found {header}")
    line = 1
    for row in reader:
        start, line = line + 1, reader.line_num
        if None in row or any(v is None for v in row.values()):
            yield start, ValueError(f"expected {len(header)} tab/comma-separated fields, got a different number")
        else:
            yield start, row


def _parquet_rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
    import pyarrow.lib
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pyarrow.lib.ArrowException, OSError) as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing}; found {table.column_names}")
    for i, row in enumerate(table.to_pylist()):
        yield f"row {i}", row


def _json_rows(path: Path, on_error: OnError, summary: ReadSummary) -> Iterator[tuple[str, dict]]:
    if path.suffix == ".json":
        with open_data(path, binary=True) as f:
            raw = f.read()
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
        yield from ((f"item {i}", row) for i, row in enumerate(data))
        return
    line_rows = iter_jsonl(path, on_error=on_error, summary=summary)
    yield from ((f"row {i}", row) for i, row in enumerate(line_rows))


def _raw_rows(fmt: str, path: Path, on_error: OnError, summary: ReadSummary) -> Iterator[tuple[Any, dict]]:
    if not path.exists():
        raise DataError(f"{path}: no such file ({fmt} expects {_describe(fmt)})")
    if fmt in ("simpleqa", "bamboogle"):
        return _delimited_rows(path, ",", _COLUMNS[fmt])
    if fmt == "frames":
        return _delimited_rows(path, "\t", _COLUMNS[fmt])
    if path.suffix == ".parquet":
        return _parquet_rows(path, _COLUMNS[fmt])
    return _json_rows(path, on_error, summary)


def _describe(fmt: str) -> str:
    return {"simpleqa": "a CSV file", "frames": "a TSV file", "bamboogle": "a CSV file"}.get(
        fmt, "a Parquet, JSONL or JSON file")


def load_public_qa(
    fmt: str, path: str | Path, *, split: str = "train", on_error: OnError = "raise"
) -> tuple[list[dict[str, Any]], ReadSummary]:
    """Load the public QA file `path` of format `fmt` (one of FORMATS) into unified QA records."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown public QA format {fmt!r}; expected one of {list(FORMATS)}")
    path = Path(path)
    summary = ReadSummary(str(path))
    records = []
    for where, row in _raw_rows(fmt, path, on_error, summary):
        try:
            if isinstance(row, Exception):
                raise row
            question, answer, aliases, meta = _ROW_FNS[fmt](row)
        except (KeyError, TypeError, ValueError) as e:
            reason = f"{path}:{where}: " + (f"missing field {e.args[0]!r}" if isinstance(e, KeyError) else str(e))
            if on_error == "raise":
                raise DataError(reason) from None
            summary.skipped.append(reason)
            continue
        records.append({
            "id": f"{fmt}-{len(records):06d}", "kind": "qa", "question": question, "answer": answer,
            "aliases": aliases, "source": fmt, "split": split, "meta": meta,
        })
    summary.kept = len(records)
    return records, summary


def _normal(text: str) -> str:
    return " ".join("".join(c.lower() if c.isalnum() else " " for c in text).split())


def quality_filter(
    records: list[dict[str, Any]], *, max_answer_words: int = 20, max_question_chars: int = 2000
) -> tuple[list[dict[str, Any]], Counter]:
    """Keep records fit for verifiable RL; count each rejection by reason.

    Reasons: empty (no question or answer), answer_too_long (more than `max_answer_words`: not short-form
    verifiable), question_too_long, answer_in_question (the question gives the answer away), duplicate (the same
    normalised question seen before).
    """
    kept, rejected, seen = [], Counter(), set()
    for r in records:
        q, a = _normal(r["question"]), _normal(r["answer"])
        if not q or not a:
            reason = "empty"
        elif len(a.split()) > max_answer_words:
            reason = "answer_too_long"
        elif len(r["question"]) > max_question_chars:
            reason = "question_too_long"
        elif f" {a} " in f" {q} ":
            reason = "answer_in_question"
        elif q in seen:
            reason = "duplicate"
        else:
            seen.add(q)
            kept.append(r)
            continue
        rejected[reason] += 1
    return kept, rejected
