"""Graders of the evaluation: short-answer EM / F1, SimpleQA-style grades and FRAMES-style judgements.

Short answers reuse the reward's matching (searchjax.rewards.answers): normalised exact match with aliases and
numbers, and SQuAD token F1.

SimpleQA-style grades, our restatement of the published grading rules:
  CORRECT        the answer gives the gold's essential information and contradicts none of it; wording,
                 capitals, punctuation and hedging do not matter; a number must agree to the gold's last stated
                 digit.
  INCORRECT      the answer contradicts the gold, names a wrong entity, or offers alternatives (one of which
                 may be the gold) without committing to one.
  NOT_ATTEMPTED  the answer does not give the gold and does not contradict it: a refusal, "I don't know",
                 "no reliable source mentions it", an empty answer.
SimpleQA's F-score is the harmonic mean of the accuracy on attempted questions C / (C + I) and the overall
accuracy C / N.

FRAMES-style judgement: TRUE iff the answer carries the gold answer's meaning (the essence, not the wording).

Two back ends for both: `RuleGrader`, offline and deterministic (the rules above by string matching, with the
abstention phrases of `is_abstention`; an answer counts as giving the gold when it matches an alias exactly or
numerically, or holds the alias's words in a sentence of at most MAX_SENTENCE_WORDS words, since in a longer text
string matching cannot tell a committed answer from a list of candidates), and `LLMGrader` over the LLM-judge chat client the rubrics use
(`searchjax.rewards.rubrics.OpenAIChatClient` or any `messages -> text` callable).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Protocol

from searchjax.rewards.answers import answer_correct, exact_match, normalize_answer, numbers_match, token_f1
from searchjax.rewards.rubrics import ChatClient, ModelReplyError, extract_json

CORRECT, INCORRECT, NOT_ATTEMPTED = "CORRECT", "INCORRECT", "NOT_ATTEMPTED"
GRADES = (CORRECT, INCORRECT, NOT_ATTEMPTED)
TRUE, FALSE = "TRUE", "FALSE"

# Phrases that decline to answer, in the languages the QA generator writes (en, sv, ja) and the SFT abstention
# examples' wording; matched case-insensitively on the raw answer.
ABSTENTION_PHRASES = (
    "i don't know", "i do not know", "don't know", "no idea",
    "cannot tell", "can't tell", "cannot determine", "can't determine", "cannot find", "can't find",
    "could not find", "couldn't find", "could not determine", "unable to find", "unable to determine",
    "unable to answer", "cannot answer", "can't answer", "no reliable", "no information", "not enough information",
    "no result", "does not exist", "doesn't exist", "not found", "i cannot say", "i can't say",
    "jag vet inte", "vet inte", "kunde inte hitta", "kan inte hitta", "ingen pålitlig", "ingen tillförlitlig",
    "ingen information", "kan inte svara", "finns inte",
    "わかりません", "分かりません", "わからない", "分からない", "見つかりません", "見つからない", "不明",
    "存在しません", "答えられません", "情報がありません",
)
_ABSTENTION_RE = re.compile("|".join(re.escape(p) for p in ABSTENTION_PHRASES), re.IGNORECASE)
# Hedges decline only when nothing else is said ("Not sure."); "not sure, but London" is an attempt.
HEDGES = ("i'm not sure", "i am not sure", "not sure", "osäker", "inte säker", "確かではありません")
_HEDGE_RE = re.compile("|".join(re.escape(p) for p in HEDGES), re.IGNORECASE)
# An answer that offers alternatives without committing ("X or Y", "either X or Y", "X eller Y", "XかY").
_ALTERNATIVES_RE = re.compile(r"\b(?:or|either|eller|antingen)\b|または|もしくは", re.IGNORECASE)


def is_abstention(answer: str) -> bool:
    """Whether `answer` declines to answer: it is empty or only a hedge, or it contains an ABSTENTION_PHRASE."""
    if not normalize_answer(_HEDGE_RE.sub(" ", answer)):
        return True
    return _ABSTENTION_RE.search(answer) is not None


def short_answer_scores(answer: str, aliases: Sequence[str]) -> tuple[bool, float]:
    """(EM with aliases and numbers, best token F1 over the aliases) of `answer`."""
    return answer_correct(answer, list(aliases)), max(token_f1(answer, a) for a in aliases)


MAX_SENTENCE_WORDS = 30


def _contains(answer: str, alias: str) -> bool:
    """The alias's normalised words occur as a contiguous run of the answer's (of at most MAX_SENTENCE_WORDS)."""
    a, g = normalize_answer(answer).split(), normalize_answer(alias).split()
    if not g or len(a) > MAX_SENTENCE_WORDS:
        return False
    return any(a[i : i + len(g)] == g for i in range(len(a) - len(g) + 1))


def _gives_gold(answer: str, aliases: Sequence[str]) -> bool:
    """The answer states the gold: an exact / numeric match, or the alias inside a longer sentence."""
    for alias in aliases:
        if numbers_match(alias, alias):  # true iff the alias is a bare number
            if numbers_match(answer, alias):  # every number the answer states agrees with it
                return True
        elif exact_match(answer, alias) or _contains(answer, alias):
            return True
    return False


class Grader(Protocol):
    """Grades one answer against its gold aliases (the question gives an LLM judge its context)."""

    def simpleqa(self, question: str, answer: str, aliases: Sequence[str]) -> str: ...

    def frames(self, question: str, answer: str, aliases: Sequence[str]) -> str: ...


class RuleGrader:
    """The offline back end: the module docstring's rules by string matching."""

    def simpleqa(self, question: str, answer: str, aliases: Sequence[str]) -> str:
        del question
        if answer_correct(answer, list(aliases)):
            return CORRECT
        gives = _gives_gold(answer, aliases)
        if gives and not _ALTERNATIVES_RE.search(answer):
            return CORRECT
        if not gives and is_abstention(answer):
            return NOT_ATTEMPTED
        return INCORRECT

    def frames(self, question: str, answer: str, aliases: Sequence[str]) -> str:
        return TRUE if self.simpleqa(question, answer, aliases) == CORRECT else FALSE


SIMPLEQA_JUDGE = (
    "You grade an answer to a question against the gold target. Reply with JSON only: "
    '{"grade": "CORRECT" | "INCORRECT" | "NOT_ATTEMPTED"}. CORRECT: the answer gives the gold target\'s essential '
    "information and contradicts none of it (wording, capitals, punctuation and hedging do not matter; a number "
    "must agree to the gold's last stated digit). INCORRECT: the answer contradicts the gold, names something "
    "else, or lists alternatives without committing to one. NOT_ATTEMPTED: the answer neither gives nor "
    "contradicts the gold (a refusal, 'I don't know', no evidence found)."
)
FRAMES_JUDGE = (
    "You judge whether an answer to a question is correct given the gold answer. The answer is correct if it "
    "carries the gold answer's meaning (its essence), even in other words or with more detail; it is wrong if it "
    'contradicts the gold or misses its essence. Reply with JSON only: {"correct": true | false}.'
)


@dataclasses.dataclass
class LLMGrader:
    """The model-server back end: the same rules, judged by a chat model (`messages -> text`)."""

    client: ChatClient

    def _ask(self, system: str, question: str, answer: str, aliases: Sequence[str]) -> dict:
        gold = " | ".join(aliases)
        user = f"QUESTION:\n{question}\n\nGOLD TARGET:\n{gold}\n\nANSWER:\n{answer}"
        reply = extract_json(self.client([{"role": "system", "content": system}, {"role": "user", "content": user}]))
        if not isinstance(reply, dict):
            raise ModelReplyError(f"grader reply must be a JSON object, got {reply!r:.200}")
        return reply

    def simpleqa(self, question: str, answer: str, aliases: Sequence[str]) -> str:
        grade = self._ask(SIMPLEQA_JUDGE, question, answer, aliases).get("grade")
        if grade not in GRADES:
            raise ModelReplyError(f"grader reply must hold a grade in {list(GRADES)}, got {grade!r}")
        return grade

    def frames(self, question: str, answer: str, aliases: Sequence[str]) -> str:
        correct = self._ask(FRAMES_JUDGE, question, answer, aliases).get("correct")
        if not isinstance(correct, bool):
            raise ModelReplyError(f"grader reply must hold a boolean 'correct', got {correct!r}")
        return TRUE if correct else FALSE


def simpleqa_f_score(grades: Sequence[str]) -> dict[str, float]:
    """SimpleQA's aggregate: overall accuracy C/N, accuracy given attempted C/(C+I), and their harmonic mean F.

    Empty denominators give 0.0 (no attempt means no accuracy on attempted questions).
    """
    unknown = sorted(set(grades) - set(GRADES))
    if unknown:
        raise ValueError(f"simpleqa_f_score: unknown grade(s) {unknown}; expected {list(GRADES)}")
    n, c, i = len(grades), grades.count(CORRECT), grades.count(INCORRECT)
    overall = c / n if n else 0.0
    given_attempted = c / (c + i) if c + i else 0.0
    f = 2 * overall * given_attempted / (overall + given_attempted) if overall + given_attempted else 0.0
    return {"correct": overall, "correct_given_attempted": given_attempted, "f_score": f,
            "not_attempted": grades.count(NOT_ATTEMPTED) / n if n else 0.0}
