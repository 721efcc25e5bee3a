"""The questions an evaluation asks: a QA JSONL (`data synth-qa`) or a public benchmark through its loader.

A QA JSONL row needs id, question and answer; aliases (list of str), hops, language (ISO 639-1; default "en")
and answerable (bool; default true) are read when present, other fields are ignored. An unanswerable row (a
question about an entity that does not exist) has answerable false and its answer is not used. A bad row
stops the read with `file:line: reason` before any model is loaded.

Benchmarks are given as NAME=FILE, NAME one of searchjax.data.public.FORMATS; their grader is the benchmark's
own (SimpleQA's three grades for simpleqa, FRAMES's TRUE/FALSE for frames, short-answer EM otherwise).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from searchjax.data.jsonl import DataError, read_jsonl, require
from searchjax.data.public import FORMATS, load_public_qa
from searchjax.rewards.rubrics import LANGUAGES

# Which grade decides `correct` for each source (see searchjax.eval.graders).
GRADED_BY = {"simpleqa": "simpleqa", "frames": "frames"}


@dataclasses.dataclass(frozen=True)
class EvalQuestion:
    """One question: `aliases` holds the gold answer first, then its other names."""

    id: str
    question: str
    aliases: tuple[str, ...]
    language: str = "en"
    answerable: bool = True
    source: str = "qa"

    @property
    def grading(self) -> str:
        """"simpleqa", "frames" or "short" (EM with aliases and numbers)."""
        return GRADED_BY.get(self.source, "short")


def _validator(seen: set[str]):
    def validate(row: dict[str, Any]) -> None:
        qid = require(row, "id", str)
        if not qid:
            raise ValueError("field 'id' is empty")
        if qid in seen:
            raise ValueError(f"duplicate id {qid!r}")
        if not require(row, "question", str).strip():
            raise ValueError("field 'question' is empty")
        answerable = row.get("answerable", True)
        if not isinstance(answerable, bool):
            raise TypeError(f"field 'answerable': expected bool, got {answerable!r:.40}")
        answer = require(row, "answer", str)
        if answerable and not answer.strip():
            raise ValueError("field 'answer' is empty (an unanswerable question says answerable: false)")
        aliases = row.get("aliases", [])
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise TypeError(f"field 'aliases': expected a list of strings, got {aliases!r:.60}")
        language = row.get("language", "en")
        if language not in LANGUAGES:
            raise ValueError(f"field 'language': {language!r} is not one of {sorted(LANGUAGES)}")
        seen.add(qid)

    return validate


def load_questions(path: str | Path) -> list[EvalQuestion]:
    """The questions of a QA JSONL; a malformed row raises DataError("file:line: reason")."""
    rows, _ = read_jsonl(path, validate=_validator(set()))
    if not rows:
        raise DataError(f"{path}: no questions")
    return [
        EvalQuestion(r["id"], r["question"], tuple(a for a in [r["answer"], *r.get("aliases", [])] if a.strip()),
                     r.get("language", "en"), r.get("answerable", True))
        for r in rows
    ]


def parse_benchmark(spec: str) -> tuple[str, Path]:
    """NAME=FILE -> (NAME, FILE), NAME checked against the public loaders."""
    name, sep, file = spec.partition("=")
    if not sep or not file:
        raise ValueError(f"--benchmark expects NAME=FILE (NAME one of {list(FORMATS)}), got {spec!r}")
    if name not in FORMATS:
        raise ValueError(f"--benchmark {spec!r}: unknown benchmark {name!r}; expected one of {list(FORMATS)}")
    return name, Path(file)


def load_benchmark(name: str, path: str | Path) -> list[EvalQuestion]:
    """A public benchmark's questions (the published file format); a bad row raises DataError naming it."""
    records, _ = load_public_qa(name, path, split="test")
    if not records:
        raise DataError(f"{path}: no questions")
    return [EvalQuestion(r["id"], r["question"], (r["answer"], *r["aliases"]), "en", True, name) for r in records]
