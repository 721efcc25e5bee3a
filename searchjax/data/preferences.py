"""Preference pairs for the Bradley–Terry reward model (RECIPE.md §4): building, the agreement filter, loading.

Record (one JSONL object; TRL's conversational preference shape, which its RewardTrainer reads, plus ours):
  id        str
  category  one of CATEGORIES (or any string in a user's own file)
  prompt    the shared context as OpenAI-style messages: the system turn, the user turn(s) and, where the
            category has them, the search turns both responses build on
  chosen    the better response's turns (assistant, and tool turns where it searched)
  rejected  the worse response's turns, same shape
  source    the QA / rubric record it was made from ("" when none)
  split     "train" | "dev" (by the answer entity, the invented name or the rubric prompt, never both)
  votes     {judge name: +1 chosen better, -1 rejected better, 0 undecided}

Categories, each with a known better response (the world's KB, the verified QA and the rubric data):
  correctness  the expert's search trajectory, then the answer vs the same wording with another question's
               answer of the same type (a name the results do not mention)
  grounded     one search for a literal fact of a KB entity; the value the results state vs another value
  format       the requested format (list / table / one sentence) vs the same content in another
  language     the user's language vs another (QA answers; rubric translations and same-language corrections)
  concise      the answer vs the answer padded with filler sentences
  refusal      the answer vs an unjustified refusal (the evidence is there)
  abstention   for an entity that does not exist (the search finds nothing): saying so vs an invented value
A record is one unordered pair; every use takes it in both orders, (a, b, r) = (chosen, rejected, 1) and
(rejected, chosen, 0): the symmetric loss L_sym in training and the order average P̄ in scoring (both orders are
the two rows of one forward, searchjax.rewards.reward_model), so the pairwise head never sees one order only.

Label noise: n judges vote on every built pair — `RuleJudge` (rule checks), `RubricJudge` (the pair's rubric
set through searchjax.rewards.rubrics), `LLMPairJudge` (any chat client, when configured) — and a pair is kept
when at least k of them vote for its chosen response (`agreement_keep`); the report gives the kept share per
category. `read_preferences` loads any file in TRL's shapes (conversational or plain strings, explicit or
implicit prompt); a bad row is a DataError naming file:line.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from searchjax.chat.template import ChatTemplateError, render, render_segments
from searchjax.data.jsonl import ReadSummary, iter_jsonl
from searchjax.data.prompts import system_message
from searchjax.data.questions import PIN_RELATIONS, describe, mentions
from searchjax.data.sft import THOUGHT_STYLES, SFTBuilder, format_answer, question_format, tool_call_turn
from searchjax.data.synth import FORMAT_INSTRUCTIONS
from searchjax.rewards.rubrics import (
    ChatClient,
    ModelReplyError,
    Rubric,
    RuleJudge as RubricRuleJudge,
    check_format,
    detect_language,
    evaluate_rubrics,
    identify_language,
    extract_json,
)
from searchjax.search import SearchBackend, SearchTool
from searchjax.search.world import KnowledgeBase

CATEGORIES = ("correctness", "grounded", "format", "language", "concise", "refusal", "abstention")
JUDGES = ("rules", "rubrics", "llm")
ROLES = ("system", "user", "assistant", "tool")

# Another-language renderings of the plain answer sentence (the QA questions are English).
ANSWER_IN = {"de": "Die Antwort ist {a}.", "fr": "La réponse est {a}.", "es": "La respuesta es {a}.",
             "sv": "Svaret är {a}."}
FILLER_BEFORE = ("Great question! I am really happy to help you with this one.",
                 "Thank you so much for asking, this is a very interesting topic to think about.")
FILLER_AFTER = ("I hope this helps, and please let me know if you have any other questions!",
                "It is always worth double-checking such details, and I am happy to help further.")
REFUSALS = ("I'm sorry, but I can't help with that request.", "I am not able to answer this question.",
            "Unfortunately, I cannot provide an answer to that.")
_FILLER_RE = re.compile(r"great question|happy to help|hope this helps|let me know if|thank you so much for asking|"
                        r"worth double-checking", re.I)
_REFUSAL_RE = re.compile(r"\b(?:can't|cannot|can not|not able to|unable to) (?:help|answer|provide)", re.I)
_CLAIM_RE = re.compile(r"\d[\d,.]*\d|\d|[A-Z][\w'’-]*(?: (?:of |de |the )?[A-Z][\w'’-]*)*")
_NOT_CLAIMS = frozenset("The A An I It This That According Answer Response Svaret Die La El".split())
_TARGET_LANG = {"German": "de", "French": "fr", "Spanish": "es", "Swedish": "sv", "English": "en"}


@dataclasses.dataclass(frozen=True)
class PreferenceConfig:
    """Preference data options (configs/data/preferences.yaml)."""

    seed: int = 0
    categories: tuple[str, ...] = CATEGORIES
    pairs_per_category: int = 200
    dev_fraction: float = 0.2
    tool_budget: int = 5
    max_results: int = 3  # results a search shows: a tiny model's context must hold the trajectory
    thoughts: str = "plain"  # the trajectories' thinking style, as the SFT data's (searchjax.data.sft.THOUGHT_STYLES)
    judges: tuple[str, ...] = ("rules", "rubrics")  # "llm" needs an endpoint (searchjax data preferences --judge-url)
    min_agree: int = 2  # k: keep a pair when at least k of the n judges vote for its chosen response

    def __post_init__(self):
        # TypeError, as searchjax.config expects of __post_init__ checks: load_yaml names the file then.
        unknown = sorted(set(self.categories) - set(CATEGORIES))
        if unknown or not self.categories:
            raise TypeError(f"PreferenceConfig.categories: unknown {unknown}; valid: {list(CATEGORIES)}")
        bad = sorted(set(self.judges) - set(JUDGES))
        if bad or not self.judges or len(set(self.judges)) != len(self.judges):
            raise TypeError(f"PreferenceConfig.judges: distinct names from {list(JUDGES)}, got {list(self.judges)}")
        if not 1 <= self.min_agree <= len(self.judges):
            raise TypeError(f"PreferenceConfig.min_agree must be in [1, {len(self.judges)}] (the number of judges), "
                            f"got {self.min_agree}")
        if self.thoughts not in THOUGHT_STYLES:
            raise TypeError(f"PreferenceConfig.thoughts: one of {list(THOUGHT_STYLES)}, got {self.thoughts!r}")
        if not 0 <= self.dev_fraction < 1:
            raise TypeError(f"PreferenceConfig.dev_fraction must be in [0, 1), got {self.dev_fraction}")
        for name in ("pairs_per_category", "tool_budget", "max_results"):
            if getattr(self, name) < 1:
                raise TypeError(f"PreferenceConfig.{name}: expected >= 1, got {getattr(self, name)}")


# ---------------------------------------------------------------------------------------------------- helpers
def _say(content: str, reasoning: str | None = None) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        turn["reasoning_content"] = reasoning
    return turn


def _swap_name(turn: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """The turn with every whole-word `old` in its content and reasoning replaced by `new`."""
    pattern = re.compile(r"(?<!\w)" + re.escape(old) + r"(?!\w)")
    return {k: pattern.sub(new, v) if k in ("content", "reasoning_content") and isinstance(v, str) else v
            for k, v in turn.items()}


def _stated(phrase: str, value: str) -> list[dict[str, Any]]:
    """The one-turn answer "<Phrase> is <value>, as the search results state." of a grounded pair."""
    return [_say(f"{phrase[0].upper()}{phrase[1:]} is {value}, as the search results state.")]


def _split(group: str, seed: int, dev_fraction: float) -> str:
    return "dev" if zlib.crc32(f"{seed}:{group}".encode()) % 10_000 < dev_fraction * 10_000 else "train"


def _words(text: str) -> int:
    return len(text.split())


def _rubric(text: str, kind: str, priority: int = 0, **params) -> dict[str, Any]:
    return Rubric(text, kind, params, priority).to_dict()


def _pair(category: str, prompt, chosen, rejected, source: str, group: str, rubrics: list[dict]) -> dict[str, Any]:
    return {"category": category, "prompt": prompt, "chosen": chosen, "rejected": rejected, "source": source,
            "group": group, "rubrics": rubrics}


def user_text(prompt: Sequence[dict[str, Any]]) -> str:
    """The content of the prompt's last user turn ("" if it has none)."""
    return next((m["content"] for m in reversed(prompt) if m["role"] == "user"), "")


def _rubric_lang(record: dict[str, Any]) -> str | None:
    return next((r["params"]["lang"] for r in record["rubrics"] if r["kind"] == "language"), None)


# --------------------------------------------------------------------------------------------------- builders
class PreferenceBuilder:
    """Builds the candidate pairs of every category (module docstring) from a world, QA and rubric records."""

    def __init__(self, kb: KnowledgeBase, backend: SearchBackend, cfg: PreferenceConfig):
        self.kb, self.backend, self.cfg = kb, backend, cfg
        self.expert = SFTBuilder(kb, backend, tool_budget=cfg.tool_budget, seed=cfg.seed,
                                 max_results=cfg.max_results, thoughts=cfg.thoughts)
        self.summary: Counter = Counter()

    def _rng(self, *key) -> random.Random:
        return random.Random(":".join(str(k) for k in (self.cfg.seed, *key)))

    def _system(self) -> dict[str, str]:
        return system_message(self.cfg.tool_budget)

    def _wrong_answers(self, solved) -> dict[str, str]:
        """record id -> a wrong answer: the questions of one entity type and split, in a seeded cycle, each take
        the next one's answer (skipping names its search results mention). So within the category every name is
        the right answer of one pair and the wrong answer of about one other: no name prior tells the label, only
        the context does."""
        groups = defaultdict(list)
        for record, messages, _ in solved:
            key = (self.kb.entity(record["seed"]).type, _split(record["seed"], self.cfg.seed, self.cfg.dev_fraction))
            groups[key].append((record, _tool_text(messages)))
        out = {}
        for key in sorted(groups):
            members = sorted(groups[key], key=lambda m: m[0]["id"])
            self._rng("correctness", *key).shuffle(members)
            for k, (record, context) in enumerate(members):
                names = {n.casefold() for n in (record["answer"], *record["aliases"])}
                for step in range(1, len(members)):
                    other = members[(k + step) % len(members)][0]["answer"]
                    if other.casefold() not in names and not mentions(context, other):
                        out[record["id"]] = other
                        break
        return out

    def trajectories(self, qa: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict], list[str]]]:
        """(QA record, expert messages, the entities its searches found) for the English, answerable records the
        search expert solves."""
        out = []
        for record in qa:
            if record.get("language", "en") != "en" or not record.get("answerable", True):
                continue
            solved = self.expert.solved(record)
            if solved is not None:
                out.append((record, solved[0], list(solved[1].found)))
        self.summary["qa_solved"] += len(out)
        return out

    def correctness(self, solved) -> Iterator[dict[str, Any]]:
        wrong = self._wrong_answers(solved)
        for record, messages, _ in solved:
            if record["id"] not in wrong:  # its group has no other answer the results leave unmentioned
                continue
            final = messages[-1]
            rejected = _swap_name(final, record["answer"], wrong[record["id"]])
            yield _pair("correctness", messages[:-1], [final], [rejected], record["id"], record["seed"],
                        [_rubric(f"The response names {record['answer']}.", "contains", all=[record["answer"]])])

    def refusal(self, solved, rubric: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for record, messages, _ in solved:
            refusal = REFUSALS[zlib.crc32(record["id"].encode()) % len(REFUSALS)]
            yield _pair("refusal", messages[:-1], [messages[-1]], [_say(refusal)], record["id"], record["seed"],
                        [_rubric(f"The response names {record['answer']}.", "contains", all=[record["answer"]])])
        for r in rubric:
            refusal = REFUSALS[zlib.crc32(r["id"].encode()) % len(REFUSALS)]
            yield _pair("refusal", [self._system(), *r["messages"]], [_say(r["reference"])], [_say(refusal)],
                        r["id"], r["messages"][-1]["content"], r["rubrics"])

    def grounded(self, n: int) -> Iterator[dict[str, Any]]:
        """One search for a literal fact of a KB entity; the stated value vs another entity's value."""
        rels = sorted((r for r in self.kb.relations if r.relation in PIN_RELATIONS),
                      key=lambda r: (r.subject, r.relation))
        values = defaultdict(set)
        for r in rels:
            values[r.relation].add(r.value)
        self._rng("grounded").shuffle(rels)
        made = 0
        for r in rels:
            if made >= n:
                return
            name = self.kb.entity(r.subject).name
            phrase = describe(r.relation, "o", name)
            query = phrase.removeprefix("the ")
            result = SearchTool(self.backend, self.cfg.tool_budget, self.cfg.max_results).call({"query": query})
            others = sorted(v for v in values[r.relation] if v != r.value and not mentions(result.text, v))
            if not result.ok or not mentions(result.text, r.value) or not others:
                self.summary["grounded:value_not_found"] += 1
                continue
            other = self._rng("grounded", r.subject, r.relation).choice(others)
            prompt = [self._system(), {"role": "user", "content": f"What is {phrase}?"},
                      tool_call_turn(f"I need {phrase}, so I will search for it.", query),
                      {"role": "tool", "content": result.text}]
            made += 1
            yield _pair("grounded", prompt, _stated(phrase, r.value), _stated(phrase, other), r.subject, r.subject,
                        [_rubric(f"The response states {r.value}.", "contains", all=[r.value])])

    def format(self, solved, rubric: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        rubric_formats = {"format": "table", "plan": "list"}
        for record, _, chain in solved:
            question, fmt = record["question"], question_format(record["question"])
            if fmt is None:  # no instruction yet: add one, as synth's format-diversity copies do
                fmt, instruction = FORMAT_INSTRUCTIONS[zlib.crc32(record["id"].encode()) % len(FORMAT_INSTRUCTIONS)]
                question = f"{question} {instruction}"
            other = self._rng("format", record["id"]).choice([f for f, _ in FORMAT_INSTRUCTIONS if f != fmt])
            want = "one_sentence" if fmt == "sentence" else fmt
            yield _pair("format", [self._system(), {"role": "user", "content": question}],
                        [_say(format_answer(record["answer"], chain, fmt))],
                        [_say(format_answer(record["answer"], chain, other))], record["id"], record["seed"],
                        [_rubric(f"The response is a {fmt}.", "format", format=want)])
        for r in rubric:
            if r.get("category") in rubric_formats:
                yield _pair("format", [self._system(), *r["messages"]], [_say(r["reference"])],
                            [_say(_flatten(r["reference"]))], r["id"], r["messages"][-1]["content"], r["rubrics"])

    def language(self, solved, rubric: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for record, _, _ in solved:
            lang = sorted(ANSWER_IN)[zlib.crc32(record["id"].encode()) % len(ANSWER_IN)]
            yield _pair("language", [self._system(), {"role": "user", "content": record["question"]}],
                        [_say(f"The answer is {record['answer']}.")],
                        [_say(ANSWER_IN[lang].format(a=record["answer"]))], record["id"], record["seed"],
                        [_rubric("The response is written in English.", "language", lang="en")])
        corrections = defaultdict(list)
        for r in rubric:
            if r.get("category") == "same_language":
                corrections[_rubric_lang(r)].append(r["reference"])
        for r in rubric:
            if r.get("category") == "translate":
                source = re.search(r'"(.+)"', r["messages"][-1]["content"])
                other = source.group(1) if source else None
            elif r.get("category") == "same_language":
                pool = sorted({x for lang, refs in corrections.items() if lang != _rubric_lang(r) for x in refs})
                other = self._rng("language", r["id"]).choice(pool) if pool else None
            else:
                continue
            if other is not None:
                yield _pair("language", [self._system(), *r["messages"]], [_say(r["reference"])], [_say(other)],
                            r["id"], r["messages"][-1]["content"], r["rubrics"])

    def concise(self, solved, rubric: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        def padded(text: str, key: str) -> str:
            i = zlib.crc32(key.encode())
            return f"{FILLER_BEFORE[i % 2]} {text} {FILLER_AFTER[(i // 2) % 2]}"

        def limit(text: str) -> dict[str, Any]:
            n = math.ceil(1.5 * _words(text)) + 3
            return _rubric(f"The response has at most {n} words.", "length", max_words=n)

        for record, _, _ in solved:
            answer = f"The answer is {record['answer']}."
            yield _pair("concise", [self._system(), {"role": "user", "content": record["question"]}],
                        [_say(answer)], [_say(padded(answer, record["id"]))], record["id"], record["seed"],
                        [limit(answer)])
        for r in rubric:
            if r.get("category") in ("correct", "rewrite", "plan"):
                yield _pair("concise", [self._system(), *r["messages"]], [_say(r["reference"])],
                            [_say(padded(r["reference"], r["id"]))], r["id"], r["messages"][-1]["content"],
                            [*r["rubrics"], limit(r["reference"])])

    def abstention(self, n: int) -> Iterator[dict[str, Any]]:
        made = attempts = 0
        while made < n and attempts < 20 * n:
            attempts += 1
            example = self.expert.abstention(made)
            if example is None:
                continue
            made += 1
            messages = example["messages"]
            phrase = messages[1]["content"].removeprefix("What is ").removesuffix("?")
            name = re.search(r"searched for (.+?) but", messages[-1]["content"]).group(1)
            rng, tools = self._rng("abstention", example["id"]), _tool_text(messages)
            value, population = "", "population" in phrase
            while not value or mentions(tools, value):  # an invention, not a number the results happen to show
                value = f"{rng.randint(20_000, 2_000_000):,}" if population else str(rng.randint(1900, 2020))
            invented = _say(f"{phrase[0].upper()}{phrase[1:]} is {value}.", f"The answer is {value}.")
            yield _pair("abstention", messages[:-1], [messages[-1]], [invented], "", name,
                        [_rubric(f"The response says no source mentions {name}.", "judge", 0,
                                 keywords=[name, "no reliable source"])])

    def build(self, qa: Sequence[dict[str, Any]], rubric: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Candidate pairs, at most cfg.pairs_per_category per category, with id and split (not yet judged)."""
        solved = self.trajectories(qa) if set(self.cfg.categories) & {"correctness", "refusal", "format",
                                                                     "language", "concise"} else []
        n = self.cfg.pairs_per_category
        makers: dict[str, Callable[[], Iterator[dict[str, Any]]]] = {
            # the cycle of wrong answers runs over exactly the records that are kept
            "correctness": lambda: self.correctness(solved[:n]), "grounded": lambda: self.grounded(n),
            "format": lambda: self.format(solved, rubric), "language": lambda: self.language(solved, rubric),
            "concise": lambda: self.concise(solved, rubric), "refusal": lambda: self.refusal(solved, rubric),
            "abstention": lambda: self.abstention(n),
        }
        for category in self.cfg.categories:
            for i, pair in enumerate(_interleave(makers[category](), n)):
                pair["id"] = f"pref-{category}-{self.cfg.seed}-{i:06d}"
                pair["split"] = _split(pair.pop("group"), self.cfg.seed, self.cfg.dev_fraction)
                yield pair


def _interleave(pairs: Iterator[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """At most n pairs, alternating between QA-derived and rubric-derived ones while both last."""
    by_kind = defaultdict(list)
    for p in pairs:
        by_kind[p["source"].startswith("rubric")].append(p)
    qa, rb = by_kind[False], by_kind[True]
    mixed = [p for duo in zip(qa, rb) for p in duo] + qa[len(rb):] + rb[len(qa):]
    return mixed[:n]


def _flatten(reference: str) -> str:
    """A table or list written as one plain paragraph (its cells / items joined by commas)."""
    lines = [ln for ln in reference.splitlines() if ln.strip() and not set(ln.strip()) <= set("|-: ")]
    items = [" ".join(c.strip() for c in ln.strip().strip("|").split("|")) for ln in lines]
    items = [re.sub(r"^(?:[-*•]|\d+[.)])\s+", "", x) for x in items]
    return ", ".join(items) + "."


# ----------------------------------------------------------------------------------------------------- judges
class PairJudge(Protocol):
    """Votes on a pair: +1 when its chosen response is better, -1 when its rejected one is, 0 undecided."""

    name: str

    def __call__(self, pair: dict[str, Any]) -> int: ...


def final_text(turns: Sequence[dict[str, Any]]) -> str:
    """The content of a response's last assistant turn (its answer)."""
    return next((t.get("content") or "" for t in reversed(turns) if t["role"] == "assistant"), "")


def _tool_text(turns: Sequence[dict[str, Any]]) -> str:
    return "\n".join(t.get("content") or "" for t in turns if t["role"] == "tool")


def _vote(a: float, b: float) -> int:
    return int(np.sign(a - b))


class RuleJudge:
    """Rule checks of a response against its context, summed (each 0..1) and compared between the two:

    - grounding (when there are tool responses): claims (numbers, capitalised names not in the question) all in
      the tool text 1, some missing 0, no claim ½ (an abstention), a refusal 0;
    - refusal (no tool responses): 0 for a refusal, else 1;
    - format (when the user asks for a list, a table or one sentence): `check_format`;
    - language: the language the user asks for ("into German"), else the user's (`_language_score`);
    - filler: 0 when the response holds filler phrases, else 1.
    """

    name = "rules"

    def score(self, prompt: Sequence[dict[str, Any]], response: Sequence[dict[str, Any]]) -> float:
        user, text = user_text(prompt), final_text(response)
        tools = _tool_text([*prompt, *response])
        refusing = bool(_REFUSAL_RE.search(text))
        if tools:
            claims = [c for c in _CLAIM_RE.findall(text) if c not in _NOT_CLAIMS and not mentions(user, c)]
            found = [mentions(tools, c) for c in claims]
            total = 0.0 if refusing else (0.5 if not claims else float(all(found)))
        else:
            total = 0.0 if refusing else 1.0
        fmt = _requested_format(user)
        if fmt is not None:
            total += float(check_format(text, fmt))
        named = re.search(r"\b(?:into|to) (German|French|Spanish|Swedish|English)\b|(German|French|Spanish|Swedish) "
                          r"translation", user)
        want = _TARGET_LANG[named.group(1) or named.group(2)] if named else detect_language(user)
        return total + _language_score(text, want) + float(not _FILLER_RE.search(text))

    def __call__(self, pair: dict[str, Any]) -> int:
        return _vote(self.score(pair["prompt"], pair["chosen"]), self.score(pair["prompt"], pair["rejected"]))


def _language_score(text: str, want: str) -> float:
    """1 when `text` is in `want`, 0 when it is firmly in another language, ½ when the identifier is unsure.
    Capitalised words inside a sentence are left out first: names (Sekreil Dreileigrynd, Ankara) carry no
    language and tip a short answer ("The answer is Ankara." reads as German otherwise)."""
    lang, probability = identify_language(re.sub(r"(?<=[^.!?\n] )[A-Z][\w'’-]*", "", text))
    return 0.5 if probability < 0.5 else float(lang == want)


def _requested_format(user: str) -> str | None:
    fmt = question_format(user)
    if fmt is not None:
        return "one_sentence" if fmt == "sentence" else fmt
    if re.search(r"\b(?:in|as) a table\b", user, re.I):
        return "table"
    if re.search(r"\bas a list\b", user, re.I):
        return "list"
    if re.search(r"\b(?:in|as) one sentence\b", user, re.I):
        return "one_sentence"
    return None


class RubricJudge:
    """The pair's rubric set (`pair["rubrics"]`), each response's final text judged by searchjax.rewards.rubrics
    (code kinds by code, judge kinds by `judge`, the offline RuleJudge by default); more rubrics passed wins."""

    name = "rubrics"

    def __init__(self, judge=None):
        self.judge = judge or RubricRuleJudge()

    def __call__(self, pair: dict[str, Any]) -> int:
        rubrics = [Rubric.from_dict(r) for r in pair.get("rubrics", ())]
        if not rubrics:
            return 0
        user = user_text(pair["prompt"])
        passed = [sum(evaluate_rubrics(user, final_text(pair[k]), rubrics, self.judge)) for k in ("chosen", "rejected")]
        return _vote(*passed)


PAIR_JUDGE_SYSTEM = (
    "You compare two responses to the same conversation. The better one is correct, grounded in any search "
    "results shown, in the language and format the user asked for, concise, answers when the evidence allows "
    "and says so plainly when it does not. Reply with JSON only: {\"better\": \"A\" or \"B\"}."
)


class LLMPairJudge:
    """A pairwise LLM judge over any chat client (`messages -> text`); the chosen response is shown as A or B by
    a hash of the pair id, so the judge's own position bias does not line up with the labels. A reply without
    the JSON asked for is an undecided vote (counted in `unparsed`)."""

    name = "llm"

    def __init__(self, client: ChatClient):
        self.client = client
        self.unparsed = 0

    def __call__(self, pair: dict[str, Any]) -> int:
        chosen_first = zlib.crc32(pair["id"].encode()) % 2 == 0
        a, b = (pair["chosen"], pair["rejected"]) if chosen_first else (pair["rejected"], pair["chosen"])
        context = render(pair["prompt"], add_generation_prompt=False)
        user = f"CONVERSATION:\n{context}\n\nRESPONSE A:\n{final_text(a)}\n\nRESPONSE B:\n{final_text(b)}"
        try:
            reply = extract_json(self.client([{"role": "system", "content": PAIR_JUDGE_SYSTEM},
                                              {"role": "user", "content": user}]))
            better = reply.get("better") if isinstance(reply, dict) else None
            if better not in ("A", "B"):
                raise ModelReplyError(f"expected {{'better': 'A' or 'B'}}, got {reply!r:.80}")
        except ModelReplyError:
            self.unparsed += 1
            return 0
        return 1 if (better == "A") == chosen_first else -1


def agreement_keep(votes: np.ndarray, k: int) -> np.ndarray:
    """keep_p = #{judges voting for pair p's chosen response} ≥ k, for votes [P, n] in {-1, 0, +1}.

    An undecided judge (0) counts like one voting against: k of the n must positively agree with the label the
    pair was built with (a majority against it means the construction is wrong for that pair, so it is dropped,
    never flipped).
    """
    votes = np.asarray(votes)
    if votes.ndim != 2 or not np.isin(votes, (-1, 0, 1)).all():
        raise ValueError(f"agreement_keep: votes must be [P, n] in {{-1, 0, 1}}, got shape {votes.shape}")
    if not 1 <= k <= votes.shape[1]:
        raise ValueError(f"agreement_keep: k must be in [1, {votes.shape[1]}], got {k}")
    return (votes == 1).sum(axis=1) >= k


def kept_share(categories: Sequence[str], keep: np.ndarray) -> dict[str, dict[str, float]]:
    """{category: {built, kept, kept_share}} of an agreement filter's result."""
    out: dict[str, dict[str, float]] = {}
    for c in sorted(set(categories)):
        mask = np.asarray(categories) == c
        kept = int(keep[mask].sum())
        out[c] = {"built": int(mask.sum()), "kept": kept, "kept_share": kept / int(mask.sum())}
    return out


def judge_and_filter(pairs: Sequence[dict[str, Any]], judges: Sequence[PairJudge],
                     k: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Votes of every judge on every pair, the k-of-n filter, and its report (kept share per category).
    Kept records carry `votes` and lose the internal `rubrics`."""
    votes = np.array([[j(p) for j in judges] for p in pairs], np.int64).reshape(len(pairs), len(judges))
    keep = agreement_keep(votes, k) if len(pairs) else np.zeros(0, bool)
    kept = []
    for p, v, ok in zip(pairs, votes, keep):
        if ok:
            record = {key: p[key] for key in ("id", "category", "prompt", "chosen", "rejected", "source", "split")}
            kept.append({**record, "votes": {j.name: int(x) for j, x in zip(judges, v)}})
    report = {"judges": [j.name for j in judges], "min_agree": k,
              "categories": kept_share([p["category"] for p in pairs], keep),
              "splits": dict(Counter(r["split"] for r in kept))}
    return kept, report


# ---------------------------------------------------------------------------------------------------- loading
def as_messages(value: Any, field: str, default_role: str) -> list[dict[str, Any]]:
    """A field as a message list (TypeError/ValueError naming `field`): a string becomes one `default_role`
    message; a list must hold messages with a role in ROLES and string (or part-list) content."""
    if isinstance(value, str):
        return [{"role": default_role, "content": value}]
    if not isinstance(value, list) or not value:
        raise TypeError(f"field {field!r}: expected a string or a non-empty list of messages, got {value!r:.60}")
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(f"field {field!r}[{i}]: expected a message with role in {list(ROLES)}, got {m!r:.80}")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise TypeError(f"field {field!r}[{i}].content: expected a string, got {type(content).__name__}")
    return [dict(m) for m in value]


def normalize_preference(row: dict[str, Any]) -> dict[str, Any]:
    """A row in any of TRL's preference shapes as our record (prompt / chosen / rejected message lists);
    raises ValueError / TypeError / KeyError naming the field.

    Conversational rows hold message lists, standard rows strings (the prompt a user turn, each response an
    assistant turn); without "prompt" (TRL's implicit prompt) it is the common leading turns of chosen and
    rejected. The prompt must hold a user turn; each response must hold an assistant turn and no system turn.
    """
    for field in ("chosen", "rejected"):
        if field not in row:
            raise KeyError(field)
    chosen = as_messages(row["chosen"], "chosen", "assistant")
    rejected = as_messages(row["rejected"], "rejected", "assistant")
    if "prompt" in row:
        prompt = as_messages(row["prompt"], "prompt", "user")
    else:
        n = 0
        while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
            n += 1
        prompt, chosen, rejected = chosen[:n], chosen[n:], rejected[n:]
    if not any(m["role"] == "user" for m in prompt):
        raise ValueError("field 'prompt': needs a user turn (without 'prompt', chosen and rejected must share one)")
    for field, turns in (("chosen", chosen), ("rejected", rejected)):
        if not any(m["role"] == "assistant" for m in turns) or any(m["role"] == "system" for m in turns):
            raise ValueError(f"field {field!r}: a response needs an assistant turn and no system turn")
    if chosen == rejected:
        raise ValueError("fields 'chosen' and 'rejected' are the same response")
    for field, kind in (("id", str), ("category", str), ("source", str)):
        if field in row and not isinstance(row[field], kind):
            raise TypeError(f"field {field!r}: expected {kind.__name__}, got {type(row[field]).__name__}")
    if row.get("split", "train") not in ("train", "dev"):
        raise ValueError(f"field 'split': expected 'train' or 'dev', got {row['split']!r}")
    for turns in (prompt + chosen, prompt + rejected):
        render(turns, add_generation_prompt=False)  # a conversation the chat template refuses is this row's error
    return {"id": row.get("id", ""), "category": row.get("category", "user"), "prompt": prompt, "chosen": chosen,
            "rejected": rejected, "source": row.get("source", ""), "split": row.get("split", "train")}


def read_preferences(path, *, on_error: str = "raise") -> tuple[list[dict[str, Any]], ReadSummary]:
    """Normalised preference records of a JSONL file (see `normalize_preference`); a bad row is a DataError
    "file:line: reason" (or, with on_error="skip", a counted skip). A row without an id gets "FILE#N", N its
    position among the rows read."""
    summary = ReadSummary(str(path))
    rows: list[dict[str, Any]] = []

    def check(row: dict[str, Any]) -> None:
        try:
            rows.append(normalize_preference(row))
        except ChatTemplateError as e:
            raise ValueError(f"the chat template refuses the conversation: {e}") from None

    for n, _ in enumerate(iter_jsonl(path, validate=check, on_error=on_error, summary=summary), 1):
        rows[-1]["id"] = rows[-1]["id"] or f"{Path(path).name}#{n}"
    return rows, summary


# ----------------------------------------------------------------------------------------------- tokenization
def encode_prompt_response(encode: Callable[[str], list[int]], prompt: Sequence[dict[str, Any]],
                           responses: Sequence[Sequence[dict[str, Any]]],
                           tools: Sequence[dict[str, Any]] | None = None, *, masks: bool = False):
    """Token ids of x (the rendered prompt, through its last <|im_end|>\\n) and of each response's rendered turns:
    (x, [a, b, ...]), and with masks=True (x, pieces, [mask_a, mask_b, ...]).

    x ‖ a is exactly the chat template's rendering of prompt + a (every cut sits before <|im_start|>, a special
    token, so encoding the pieces apart gives the same ids as encoding the whole). The tool schema is left out
    unless `tools` is given: it is the same text in every row (several hundred tokens) and tells pairs nothing.
    mask_a (int32, len(a)) is 1 on the tokens the assistant generates (the SFT loss mask of
    searchjax.chat.encode_conversation: each assistant turn's body through its <|im_end|>), 0 on tool responses and
    the turns' framing; a ValueError if encoding the turns apart does not give the response's ids.
    """
    x_text = render(prompt, tools, add_generation_prompt=False)
    pieces, piece_masks = [], []
    for turns in responses:
        full = render([*prompt, *turns], tools, add_generation_prompt=False)
        if not full.startswith(x_text):
            raise ValueError("the rendered prompt is not a prefix of prompt + response (the response changes how "
                             "earlier turns render)")
        ids = encode(full[len(x_text):])
        pieces.append(ids)
        if masks:
            piece_masks.append(_response_mask([*prompt, *turns], tools, len(x_text), encode, ids))
    return (encode(x_text), pieces, piece_masks) if masks else (encode(x_text), pieces)


def _response_mask(messages, tools, start: int, encode: Callable[[str], list[int]], ids: list[int]) -> np.ndarray:
    """The assistant mask of the rendered `messages` from character `start` on, whose ids are `ids`: each template
    segment (searchjax.chat.template.render_segments) encoded apart, 1 on the trainable ones."""
    mask, pieces, at = [], [], 0
    for seg in render_segments(messages, tools, add_generation_prompt=False):
        text = seg.text[max(0, start - at):]
        at += len(seg.text)
        if at > start and text:
            piece = encode(text)
            pieces += piece
            mask += [int(seg.trainable)] * len(piece)
    if pieces != list(ids):
        raise ValueError(f"the response's turns encoded one by one ({len(pieces)} tokens) differ from the whole "
                         f"response's encoding ({len(ids)} tokens): the tokenizer merges across a turn boundary")
    return np.asarray(mask, np.int32)
