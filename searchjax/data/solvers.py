"""Two independent solvers for generated questions (RECIPE.md §3.1 step 4).

Both read the question with `parse_question` (the world's public phrasing, no facts) and then answer from
different evidence:
- `KBSolver` resolves the steps as sets in the knowledge base: the innermost literal gives
  S_{h-1} = {x : rel(x) = v}; each outer step maps S to the entities on the described side of its relation. The
  answer is unique iff the final set has one element.
- `SearchSolver` has no knowledge-base access: for each step, innermost first, it issues one search_web call
  (through `SearchTool`, so the write-up's limits hold) for the describing phrase with the known side filled in,
  reads the entity on the unknown side out of the result snippets (statement sentences in the world's wordings,
  or registry "Label: value" lines), and takes the candidate most results agree on; a tie or no candidate is an
  abstention. Its trace (queries, tool responses, the reasoning per step) is the expert trajectory for SFT.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict

from searchjax.data.questions import Step, describe, parse_question
from searchjax.search import SearchBackend, SearchTool
from searchjax.search.tool import MAX_RESULTS
from searchjax.search.world import KnowledgeBase
from searchjax.search.world.schema import RELATIONS


def _cohort_ok(r, step: Step) -> bool:
    """A step that names a cohort ("the summer 2007 cohort of …") only matches relations in that cohort."""
    return not step.cohort or r.attrs.get("cohort", "") == step.cohort


class KBSolver:
    """Answers parsed questions by set resolution in the knowledge base."""

    name = "kb"

    def __init__(self, kb: KnowledgeBase):
        self.kb = kb
        self._literal: dict[tuple[str, str], list[str]] = defaultdict(list)
        for r in kb.relations:
            if r.literal:
                self._literal[(r.relation, r.value)].append(r.subject)

    def holders(self, relation: str, value: str) -> list[str]:
        """Subjects whose literal `relation` equals `value`."""
        return list(self._literal.get((relation, value), ()))

    def resolve(self, steps: list[Step]) -> set[str]:
        """The set of entity ids the description denotes (steps innermost first)."""
        current = set(self.holders(steps[0].relation, steps[0].value))
        for step in steps[1:]:
            nxt = set()
            for y in current:
                if step.unknown == "s":
                    rels = self.kb.relations_to(y, step.relation)
                    nxt.update(r.subject for r in rels if _cohort_ok(r, step))
                else:
                    rels = self.kb.relations_from(y, step.relation)
                    nxt.update(r.object for r in rels if _cohort_ok(r, step))
            current = nxt
        return current

    def solve(self, question: str) -> tuple[str | None, str]:
        """(answer name, "") when the question has one reading and one answer, else (None, reason)."""
        readings = parse_question(question)
        if len(readings) != 1:
            return None, "unparseable" if not readings else "ambiguous_reading"
        found = self.resolve(readings[0])
        if len(found) != 1:
            return None, "kb_not_unique" if found else "kb_no_answer"
        return self.kb.entity(next(iter(found))).name, ""


@dataclasses.dataclass
class SearchTrace:
    """What the search solver did: one (reasoning, query, tool response) per call, and its answer."""

    answer: str | None = None
    reason: str = ""
    calls: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    found: list[str] = dataclasses.field(default_factory=list)


_RESULT_RE = re.compile(r"^\[(\d+)\] (?P<title>[^\n]*)\nURL: (?P<url>\S*)\n(?P<snippet>.*?)(?=\n\n\[\d+\] |\Z)",
                        re.M | re.S)
_NAME = r"(?P<x>[A-Z0-9][^.!?\n]*?)"
_START = r"(?:^|(?<=\. )|(?<=\n)|(?<=! )|(?<=\? ))"
_LABELS = sorted({spec.label for spec in RELATIONS.values()}, key=len, reverse=True)
_LABEL_ALT = "|".join(re.escape(label) for label in _LABELS)
_REGISTRY_RE = re.compile(r"Registry entry for (?P<n>.+?) \([a-z ]+\)\.")


def parse_results(text: str) -> list[tuple[str, str, str]]:
    """(title, url, snippet) of each result in a search_web response (empty for "No results" or errors)."""
    return [(m.group("title"), m.group("url"), m.group("snippet")) for m in _RESULT_RE.finditer(text)]


def _statement_regexes(step: Step, known: str) -> list[re.Pattern]:
    spec = RELATIONS[step.relation]
    known_key = "s" if step.unknown == "o" else ("v" if spec.literal else "o")
    out = []
    for template in spec.forward + spec.backward:
        parts, pos = [], 0
        for m in re.finditer(r"\{([sovc])\}", template):
            parts.append(re.escape(template[pos:m.start()]))
            key = m.group(1)
            if key == known_key:
                parts.append(re.escape(known))
            elif key == "c":
                parts.append(re.escape(step.cohort) if step.cohort else r"[^.]+?")
            else:
                parts.append(_NAME)
            pos = m.end()
        parts.append(re.escape(template[pos:]))
        out.append(re.compile(_START + "".join(parts), re.M))
    return out


def _registry_regex(step: Step, known: str) -> re.Pattern:
    """'Label: value' lines of a registry page: the known side's line (unknown subject) or the unknown's value."""
    label = re.escape(RELATIONS[step.relation].label)
    tail = re.escape(f" ({step.cohort})") if step.cohort else ""
    if step.unknown == "s":
        return re.compile(rf"(?:^|\s){label}: {re.escape(known)}{tail}(?=\s|$)")
    return re.compile(rf"(?:^|\s){label}: (?P<x>.+?){tail}(?= \(|\s(?:{_LABEL_ALT}): |\n|$)")


class CandidateExtractor:
    """Names on the unknown side of `step` that a snippet states, given the known side's name or value
    (regexes compiled once per step)."""

    def __init__(self, step: Step, known: str):
        self.step, self.known = step, known
        self.statements = _statement_regexes(step, known)
        self.registry = _registry_regex(step, known)

    def __call__(self, snippet: str) -> list[str]:
        names = [m.group("x").strip() for rx in self.statements for m in rx.finditer(snippet)]
        entry = _REGISTRY_RE.search(snippet)
        if entry is None:
            return names
        if self.step.unknown == "s":
            return names + ([entry.group("n")] if self.registry.search(snippet) else [])
        if entry.group("n") != self.known:
            return names
        return names + [v.group("x") for v in self.registry.finditer(snippet)]


class SearchSolver:
    """Answers a generated question with search_web calls only (see the module docstring)."""

    name = "search"

    def __init__(self, backend: SearchBackend, max_calls: int = 5, max_results: int = MAX_RESULTS):
        self.backend, self.max_calls, self.max_results = backend, max_calls, max_results

    def solve(self, question: str) -> SearchTrace:
        trace = SearchTrace()
        readings = parse_question(question)
        if len(readings) != 1:
            trace.reason = "unparseable" if not readings else "ambiguous_reading"
            return trace
        tool = SearchTool(self.backend, max_calls=self.max_calls, max_results=self.max_results)
        known = readings[0][0].value
        for step in readings[0]:
            name = self._step(tool, step, known, trace)
            if name is None:
                return trace
            trace.found.append(name)
            known = name
        trace.answer = known
        return trace

    def _step(self, tool: SearchTool, step: Step, known: str, trace: SearchTrace) -> str | None:
        phrase = describe(step.relation, step.unknown, known, step.cohort)
        query = re.sub(r"^(?:the|a) ", "", phrase)
        result = tool.call({"query": query})
        thought = f"I need {phrase}, so I will search for it."
        trace.calls.append((thought, query, result.text))
        if not result.ok:
            trace.reason = f"tool_error:{result.error}"
            return None
        votes, extract = Counter(), CandidateExtractor(step, known)
        for _, _, snippet in parse_results(result.text):
            for name in set(extract(snippet)):
                if name != known and name not in trace.found:
                    votes[name] += 1
        ranked = votes.most_common(2)
        if not ranked:
            trace.reason = "search_no_candidate"
            return None
        if len(ranked) == 2 and ranked[0][1] == ranked[1][1]:
            trace.reason = "search_tie"
            return None
        return ranked[0][0]
