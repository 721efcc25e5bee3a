"""Rubric chat data (RECIPE.md §3.2): non-verifiable prompts, reference answers, rubric sets, pass@4 calibration.

A rubric record (one JSONL object):
  id, kind="rubric", category (correct | rewrite | plan | format | translate | same_language), messages (the
  conversation so far, OpenAI-style, ending with the user turn), reference (a reference answer), rubrics (list
  of `Rubric.to_dict()`, in the write-up's priority order: explicit user requirements (0), internal constraints
  (1), content requirements implied by the reference (2)), seed, split.

Generators share one interface, `generator(messages, rng) -> (reference, rubrics)`:
  `template_rubrics` is the offline default (rules derived from how the prompt was built);
  `LLMRubricGenerator(client)` asks any chat client (own model or an OpenAI-compatible endpoint) for both.
`calibrate_pass_at_k` samples k responses per prompt from any policy callable, judges each against the full set,
and keeps the prompts where some but not all pass.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any

from searchjax.data.jsonl import require
from searchjax.rewards.rubrics import (
    KINDS,
    ChatClient,
    Judge,
    ModelReplyError,
    Rubric,
    evaluate_rubrics,
    extract_json,
)

# Sentences in plain English; each is corrupted into an informal prompt for the "correct" and "rewrite" kinds.
_SUBJECTS = ("She", "He", "Our manager", "The team lead", "My colleague", "The coordinator")
_ACTIONS = (
    ("share the manpower planning with you", ("manpower", "planning")),
    ("send you the budget report tomorrow", ("budget", "report")),
    ("review the workshop schedule before Friday", ("workshop", "schedule")),
    ("confirm the hotel booking for the visitors", ("hotel", "booking")),
    ("update the training calendar next week", ("training", "calendar")),
    ("prepare the meeting notes for the client", ("meeting", "notes")),
)
_SECOND = (
    ("We have to arrange lodging and boarding.", ("lodging", "boarding")),
    ("Please reply as soon as possible.", ("reply",)),
    ("We need transport and meals for everyone.", ("transport", "meals")),
    ("Thanks for your patience and support.", ("patience", "support")),
)
# informal token -> formal replacement; the rubric forbids the informal one (priority 0: the user asked to fix it)
_INFORMAL = {"you": "u", "Please": "Plz", "and": "&", "Thanks": "Thx", "for": "4", "your": "ur"}
_SPLIT_WORDS = {"manpower": "man power", "workshop": "work shop", "timetable": "time table"}
_TYPOS = {"sentence": "swntence", "message": "mesage", "paragraph": "paragrph"}

_PLAN_TOPICS = (
    ("move a small office to a new building", ("inventory", "movers", "internet", "announce")),
    ("organise a two-day team offsite", ("venue", "agenda", "transport", "budget")),
    ("launch a community newsletter", ("audience", "editor", "schedule", "feedback")),
    ("prepare for a marathon in sixteen weeks", ("mileage", "rest", "nutrition", "taper")),
)
_TABLE_ITEMS = (
    ("fruit prices", (("apples", "3"), ("pears", "4"), ("plums", "2"))),
    ("room capacities", (("Atlas", "12"), ("Borealis", "8"), ("Cygnus", "20"))),
    ("team sizes", (("design", "5"), ("research", "7"), ("support", "9"))),
)
_TRANSLATE = (
    ("de", "German", "The meeting is on Monday and we will not be late.",
     "Das Treffen ist am Montag und wir werden nicht zu spät sein.", ("Montag",)),
    ("fr", "French", "The report is ready and we will send it with the invoice.",
     "Le rapport est prêt et nous allons l'envoyer avec la facture.", ("rapport",)),
    ("es", "Spanish", "The hotel is near the station and the rooms are large.",
     "El hotel está cerca de la estación y las habitaciones son grandes.", ("hotel",)),
    ("sv", "Swedish", "The office is closed on Friday and we are at home.",
     "Kontoret är stängt på fredag och vi är hemma.", ("fredag",)),
)
# Correction requests written in another language: the answer must stay in the user's language.
_SAME_LANGUAGE = (  # (lang, name, request phrase, text to correct, reference, key words)
    ("de", "German", "bitte korrigiere:", "wir haben das treffen am montag und sie kommt nicht mit",
     "Wir haben das Treffen am Montag, und sie kommt nicht mit.", ("Treffen", "Montag")),
    ("fr", "French", "corrige stp :", "nous avons la réunion lundi et elle ne vient pas avec nous",
     "Nous avons la réunion lundi, et elle ne vient pas avec nous.", ("Nous", "réunion")),
    ("es", "Spanish", "corrige por favor:", "tenemos la reunión el lunes y ella no viene con nosotros",
     "Tenemos la reunión el lunes, y ella no viene con nosotros.", ("Tenemos", "reunión")),
    ("sv", "Swedish", "rätta gärna:", "vi har mötet på måndag och hon är inte med oss",
     "Vi har mötet på måndag, och hon är inte med oss.", ("Vi", "mötet")),
)
CATEGORIES = ("correct", "rewrite", "plan", "format", "translate", "same_language")
NO_CITATIONS = Rubric("The response contains no citation markers of the form [type:idx].", "no_citations", {}, 1)


@dataclasses.dataclass(frozen=True)
class RubricPrompt:
    """A prompt as built by `make_prompt`, with what the template generator needs to write its rubrics."""

    category: str
    messages: tuple[dict[str, str], ...]
    reference: str
    rubrics: tuple[Rubric, ...]


def _informalise(text: str, rng: random.Random) -> tuple[str, list[str], list[str]]:
    """Corrupt `text`: informal tokens, split compounds, lower case. Returns (text, informal used, compounds)."""
    words = text.split(" ")
    used, compounds = [], []
    for i, w in enumerate(words):
        core = w.rstrip(".,")
        tail = w[len(core):]
        if core in _INFORMAL and rng.random() < 0.8:
            words[i] = _INFORMAL[core] + tail
            used.append(_INFORMAL[core])
        elif core in _SPLIT_WORDS:
            words[i] = _SPLIT_WORDS[core] + tail
            compounds.append(core)
    return " ".join(words), sorted(set(used)), compounds


def _clean_pair(rng: random.Random) -> tuple[str, tuple[str, ...]]:
    subject = rng.choice(_SUBJECTS)
    action, keys1 = rng.choice(_ACTIONS)
    second, keys2 = rng.choice(_SECOND)
    return f"{subject} will {action}. {second}", keys1 + keys2


def _correction_rubrics(keys, informal, compounds) -> list[Rubric]:
    rubrics = [Rubric(f'The corrected text uses "{c}" as one word, not "{_SPLIT_WORDS[c]}".', "one_word",
                      {"word": c, "split_forms": [_SPLIT_WORDS[c]]}, 0) for c in compounds]
    if informal:
        listed = ", ".join(f'"{t}"' for t in informal)
        rubrics.append(Rubric(f"The corrected text contains none of the informal tokens {listed}.",
                              "not_contains", {"any": informal, "case_sensitive": True}, 0))
    rubrics.append(Rubric("The response is written in English.", "language", {"lang": "en"}, 1))
    rubrics.append(NO_CITATIONS)
    content = [k for k in keys if k not in compounds]
    rubrics.append(Rubric("The corrected text keeps the words " + ", ".join(f'"{k}"' for k in content) + ".",
                          "contains", {"all": content}, 2))
    return rubrics


def _make_correct(rng: random.Random) -> RubricPrompt:
    clean, keys = _clean_pair(rng)
    informal, used, compounds = _informalise(clean, rng)
    noun = rng.choice(sorted(_TYPOS))
    ask = rng.choice((f"Plz correct {_TYPOS[noun]}.", f"pls fix this {_TYPOS[noun]}", f"correct the {noun} plz"))
    msg = f"{informal} {ask}"
    rubrics = _correction_rubrics(keys, [t for t in used + ["Plz", "pls", "plz"] if _has_token(msg, t)], compounds)
    return RubricPrompt("correct", ({"role": "user", "content": msg},), clean, tuple(rubrics))


def _has_token(text: str, token: str) -> bool:
    return any(w.rstrip(".,") == token for w in text.split())


def _make_rewrite(rng: random.Random) -> RubricPrompt:
    clean, keys = _clean_pair(rng)
    informal, used, compounds = _informalise(clean, rng)
    first = clean.split(". ")[0]
    msg = f'Rewrite this in a formal tone as one sentence: "{informal}"'
    reference = first + " and " + clean.split(". ", 1)[1][0].lower() + clean.split(". ", 1)[1][1:]
    rubrics = [Rubric("The response is a single sentence.", "format", {"format": "one_sentence"}, 0)]
    rubrics += _correction_rubrics(keys, used, compounds)
    return RubricPrompt("rewrite", ({"role": "user", "content": msg},), reference, tuple(rubrics))


def _make_plan(rng: random.Random) -> RubricPrompt:
    topic, steps = rng.choice(_PLAN_TOPICS)
    n = len(steps)
    max_words = rng.choice((80, 120, 150))
    msg = f"Give me a plan of {n} steps to {topic}, as a list, in at most {max_words} words."
    reference = "\n".join(f"{i + 1}. Handle the {s} early and check it twice." for i, s in enumerate(steps))
    rubrics = (
        Rubric("The response is a list.", "format", {"format": "list"}, 0),
        Rubric(f"The response has at most {max_words} words.", "length", {"max_words": max_words}, 0),
        Rubric("The response is written in English.", "language", {"lang": "en"}, 1),
        NO_CITATIONS,
        Rubric(f"The plan covers {', '.join(steps)}.", "judge", {"keywords": list(steps)}, 2),
    )
    return RubricPrompt("plan", ({"role": "user", "content": msg},), reference, rubrics)


def _make_format(rng: random.Random) -> RubricPrompt:
    what, names = rng.choice(_TABLE_ITEMS)
    items = tuple((k, str(rng.randint(1, 99))) for k, _ in names)
    facts = "; ".join(f"{k}: {v}" for k, v in items)
    msg = f"Answer in a table: put these {what} into two columns. {facts}"
    reference = "| item | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in items)
    values = [x for kv in items for x in kv]
    rubrics = (
        Rubric("The response is a markdown table.", "format", {"format": "table"}, 0),
        Rubric("The response is written in English.", "language", {"lang": "en"}, 1),
        NO_CITATIONS,
        Rubric("The table holds every item and value given.", "contains", {"all": values}, 2),
    )
    return RubricPrompt("format", ({"role": "user", "content": msg},), reference, rubrics)


def _make_translate(rng: random.Random) -> RubricPrompt:
    lang, name, source, target, keys = rng.choice(_TRANSLATE)
    ask = rng.choice(("Translate into {}, nothing else:", "Please translate this to {}:", "{} translation only:"))
    msg = f'{ask.format(name)} "{source}"'
    rubrics = (
        Rubric(f"The response is written in {name}.", "language", {"lang": lang}, 0),
        NO_CITATIONS,
        Rubric("The translation keeps the key terms.", "contains", {"all": list(keys)}, 2),
    )
    return RubricPrompt("translate", ({"role": "user", "content": msg},), target, rubrics)


def _make_same_language(rng: random.Random) -> RubricPrompt:
    lang, name, request, text, reference, keys = rng.choice(_SAME_LANGUAGE)
    rubrics = (
        Rubric(f"The response is only the corrected text, without the request {request!r}.", "not_contains",
               {"any": [request.rstrip(" :")]}, 0),
        Rubric(f"The response is written in {name}, the language of the request.", "language", {"lang": lang}, 1),
        NO_CITATIONS,
        Rubric("The correction writes " + ", ".join(f'"{k}"' for k in keys) + " with correct capitals.", "contains",
               {"all": list(keys), "case_sensitive": True}, 2),
    )
    return RubricPrompt("same_language", ({"role": "user", "content": f"{request} {text}"},), reference, rubrics)


_MAKERS: dict[str, Callable[[random.Random], RubricPrompt]] = {
    "correct": _make_correct, "rewrite": _make_rewrite, "plan": _make_plan, "format": _make_format,
    "translate": _make_translate, "same_language": _make_same_language,
}


def make_prompt(category: str, rng: random.Random) -> RubricPrompt:
    """A templated prompt of `category` with its reference answer and template rubrics."""
    if category not in _MAKERS:
        raise ValueError(f"unknown rubric category {category!r}; expected one of {list(CATEGORIES)}")
    return _MAKERS[category](rng)


RUBRIC_WRITER_SYSTEM = (
    "Write a reference answer and a rubric set for the last user turn. Rubrics are atomic (one check each), "
    "objective and necessary, ordered: explicit user requirements, then internal constraints (language, no "
    "citation markers [type:idx]), then content the reference implies. Reply with JSON only: "
    '{"reference": str, "rubrics": [{"text": str, "kind": str, "params": {}, "priority": 0|1|2}]} '
    f"where kind is one of {list(KINDS)}."
)


class LLMRubricGenerator:
    """Reference answer + rubric set written by an LLM (any chat client) from the whole conversation."""

    def __init__(self, client: ChatClient):
        self.client = client

    def __call__(self, messages: Sequence[dict[str, str]]) -> tuple[str, list[Rubric]]:
        reply = extract_json(self.client([{"role": "system", "content": RUBRIC_WRITER_SYSTEM}, *messages]))
        reference = reply.get("reference") if isinstance(reply, dict) else None
        raw = reply.get("rubrics") if isinstance(reply, dict) else None
        if not isinstance(reference, str) or not isinstance(raw, list) or not raw:
            raise ModelReplyError("rubric writer must return a reference string and a non-empty rubric list, "
                                  f"got {reply!r:.200}")
        try:
            rubrics = sorted((Rubric.from_dict(r) for r in raw), key=lambda r: r.priority)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelReplyError(f"rubric writer returned an invalid rubric: {e}") from None
        return reference, rubrics


def generate_rubric_records(
    n: int, seed: int, *, categories: Sequence[str] = CATEGORIES, split: str = "train",
    writer: LLMRubricGenerator | None = None,
) -> list[dict[str, Any]]:
    """`n` distinct rubric records, deterministic for `seed`; categories cycle in order, and a category whose
    templates are used up yields to the next. With `writer`, the LLM writes the reference and rubrics for each
    templated conversation (the template's own are the offline default)."""
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    draw = 0
    while len(records) < n:
        p = None
        for c in range(len(categories)):
            cat = categories[(len(records) + c) % len(categories)]
            for _ in range(_DRAWS_PER_SLOT):
                draw += 1
                cand = make_prompt(cat, random.Random(f"{seed}:{draw}"))
                if cand.messages[-1]["content"] not in seen:
                    p = cand
                    break
            if p is not None:
                break
        if p is None:
            raise ValueError(f"only {len(records)} distinct rubric prompts in categories {list(categories)}; asked {n}")
        seen.add(p.messages[-1]["content"])
        reference, rubrics = (p.reference, list(p.rubrics)) if writer is None else writer(list(p.messages))
        records.append({
            "id": f"rubric-{seed}-{len(records):06d}", "kind": "rubric", "category": p.category,
            "messages": [dict(m) for m in p.messages], "reference": reference,
            "rubrics": [r.to_dict() for r in rubrics], "seed": seed, "split": split,
        })
    return records


_DRAWS_PER_SLOT = 30


def validate_rubric_record(row: dict[str, Any]) -> None:
    """Schema check for one rubric JSONL row (raises KeyError/TypeError/ValueError naming the field)."""
    for field, kind in (("id", str), ("messages", list), ("reference", str), ("rubrics", list)):
        require(row, field, kind)
    messages = row["messages"]
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise TypeError(f"field 'messages'[{i}]: expected an object with string 'role' and 'content', "
                            f"got {m!r:.80}")
    if not messages or messages[-1]["role"] != "user":
        raise ValueError("field 'messages': must end with a user turn")
    if not row["rubrics"]:
        raise ValueError("field 'rubrics': a rubric prompt needs at least one rubric (r_base = all rubrics pass)")
    for i, r in enumerate(row["rubrics"]):
        if not isinstance(r, dict):
            raise TypeError(f"field 'rubrics'[{i}]: expected an object, got {type(r).__name__}")
        Rubric.from_dict(r)


Policy = Callable[[list[dict[str, str]], int], str]


@dataclasses.dataclass
class CalibrationReport:
    n: int = 0
    kept: int = 0
    all_fail: int = 0
    all_pass: int = 0

    @property
    def kept_fraction(self) -> float:
        return self.kept / self.n if self.n else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "kept_fraction": self.kept_fraction}


def calibrate_pass_at_k(
    records: Sequence[dict[str, Any]], policy: Policy, judge: Judge, k: int = 4
) -> tuple[list[dict[str, Any]], CalibrationReport]:
    """pass@k filter: sample `policy(messages, sample_index)` k times per prompt, judge each response against
    the full rubric set, drop the prompt when 0/k or k/k pass. Kept records gain `pass_at_k` (passes out of k)."""
    if k < 2:
        raise ValueError(f"calibrate_pass_at_k: k must be >= 2 (with k = 1 every prompt passes 0/1 or 1/1), got {k}")
    report, kept = CalibrationReport(), []
    for rec in records:
        rubrics = [Rubric.from_dict(r) for r in rec["rubrics"]]
        prompt = rec["messages"][-1]["content"]
        passes = sum(all(evaluate_rubrics(prompt, policy(rec["messages"], j), rubrics, judge)) for j in range(k))
        report.n += 1
        if passes == 0:
            report.all_fail += 1
        elif passes == k:
            report.all_pass += 1
        else:
            report.kept += 1
            kept.append({**rec, "pass_at_k": f"{passes}/{k}"})
    return kept, report
