"""results.jsonl: one graded line per trajectory, appended as each finishes, read back to resume a killed run.

Keys of a line (the first twelve are the issue's contract):
  model, question_id, budget, sample, answer, correct, grade, tool_calls, failed_calls, tokens_in, tokens_out,
  finish_reason, cached_in, em, f1, answerable, abstained, question_language, answer_language,
  answer_language_p, broken_calls {category: n}, search_errors.

`correct`: short-answer EM (aliases, numbers) for QA questions, grade == CORRECT for SimpleQA, grade == TRUE
for FRAMES; for an unanswerable question, whether the answer abstained. `abstained`: the rollout ended with a
non-empty answer (finish reason "answer") that declines (searchjax.eval.graders.is_abstention), i.e. it said
plainly that it found nothing reliable; an empty answer or a rollout cut off before answering (max_tokens,
context, budget) did not abstain, though both grade NOT_ATTEMPTED. `grade`: the SimpleQA-style grade
(FRAMES: TRUE/FALSE). Lines are flushed one at a time, so a kill loses at most the line being written; a torn
last line is dropped on resume, any other bad line is an error naming file:line. When the sweep completes,
the file is rewritten in canonical order (model, question, budget, sample) so that a resumed run and an
uninterrupted one leave the same bytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from searchjax.atomic import atomic_write_text
from searchjax.data.jsonl import DataError, iter_jsonl
from searchjax.eval.calls import classify_calls, transcript_calls
from searchjax.eval.cost import billed_tokens
from searchjax.eval.dataset import EvalQuestion
from searchjax.eval.graders import CORRECT, INCORRECT, NOT_ATTEMPTED, TRUE, Grader, is_abstention, short_answer_scores
from searchjax.rewards.rubrics import identify_language
from searchjax.rollout.records import RolloutRecord

REQUIRED_KEYS = ("model", "question_id", "budget", "sample", "answer", "correct", "grade", "tool_calls",
                 "failed_calls", "tokens_in", "tokens_out", "finish_reason")
Key = tuple[str, str, int, int]


def row_key(row: dict[str, Any]) -> Key:
    return row["model"], row["question_id"], row["budget"], row["sample"]


def _grade(q: EvalQuestion, answer: str, abstained: bool, grader: Grader) -> tuple[str, bool, bool, float]:
    """(grade, correct, em, f1) of one answer (module docstring)."""
    if not q.answerable:
        return (NOT_ATTEMPTED if is_abstention(answer) else INCORRECT), abstained, False, 0.0
    em, f1 = short_answer_scores(answer, q.aliases)
    if q.grading == "frames":
        grade = grader.frames(q.question, answer, q.aliases)
        return grade, grade == TRUE, em, f1
    grade = grader.simpleqa(q.question, answer, q.aliases)
    return grade, (grade == CORRECT) if q.grading == "simpleqa" else em, em, f1


def result_row(label: str, q: EvalQuestion, budget: int, sample: int, record: RolloutRecord,
               grader: Grader) -> dict[str, Any]:
    """The results line of one finished trajectory."""
    abstained = record.finish_reason == "answer" and bool(record.answer.strip()) and is_abstention(record.answer)
    grade, correct, em, f1 = _grade(q, record.answer, abstained, grader)
    tokens_in, cached_in, tokens_out = billed_tokens(record)
    broken, search_errors = classify_calls(transcript_calls(record.turns), budget)
    language, p = identify_language(record.answer)
    return {
        "model": label, "question_id": q.id, "budget": budget, "sample": sample, "answer": record.answer,
        "correct": bool(correct), "grade": grade, "tool_calls": record.tool_calls,
        "failed_calls": record.tool_failures, "tokens_in": tokens_in, "tokens_out": tokens_out,
        "finish_reason": record.finish_reason, "cached_in": cached_in, "em": bool(em), "f1": round(f1, 6),
        "answerable": q.answerable, "abstained": abstained, "question_language": q.language,
        "answer_language": language, "answer_language_p": round(p, 4), "broken_calls": broken,
        "search_errors": search_errors,
    }


def _validate(row: dict[str, Any]) -> None:
    missing = [k for k in REQUIRED_KEYS if k not in row]
    if missing:
        raise ValueError(f"missing key(s) {missing}")
    if not isinstance(row["budget"], int) or not isinstance(row["sample"], int):
        raise TypeError("budget and sample must be integers")


class ResultsFile:
    """results.jsonl of an output directory (module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> dict[Key, dict[str, Any]]:
        """The finished lines by key; a torn last line (a kill mid-write) is cut off the file first."""
        if not self.path.exists():
            return {}
        self._drop_torn_tail()
        rows: dict[Key, dict[str, Any]] = {}
        for lineno, row in enumerate(iter_jsonl(self.path, validate=_validate), start=1):
            key = row_key(row)
            if key in rows:
                raise DataError(f"{self.path}: trajectory {key} appears twice (row {lineno})")
            rows[key] = row
        return rows

    def _drop_torn_tail(self) -> None:
        data = self.path.read_bytes()
        if not data or data.endswith(b"\n"):
            return
        keep = data[: data.rfind(b"\n") + 1]
        with self.path.open("r+b") as f:
            f.truncate(len(keep))

    def append(self, row: dict[str, Any]) -> None:
        """Append one line and flush it to the OS (a killed process keeps it)."""
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def finalize(self, rows: Iterable[dict[str, Any]]) -> None:
        """Rewrite the file atomically with `rows` in the given (canonical) order."""
        atomic_write_text(self.path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
