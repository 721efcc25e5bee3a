"""Entity-free nested questions: writing them from a chain, and reading them back into steps.

A chain (RECIPE.md §3.1) runs from the answer entity e_0 through e_1 … e_{h-1}; link i joins e_i to e_{i+1} by
a KB relation, and the last entity is pinned by a literal relation (a date, a number). The question replaces
every entity name recursively by its describing phrase (the world schema's `describe_subject` /
`describe_object` templates):

    D(h-1) = describe(e_{h-1} via literal = v)          "the accelerator launched in March 2005"
    D(i)   = describe(e_i via link i, slot = D(i+1))     "the company from the summer 2007 cohort of " + D(i+1)
    Q      = opener(D(0))                                "What is " + D(0) + "?"

`parse_question` inverts this with the same public templates (the language of the world, not its facts), giving
the steps innermost-first; both solvers start from that parse, one resolving it in the KB, one by search.
"""

from __future__ import annotations

import dataclasses
import re
from functools import lru_cache

from searchjax.search.world.schema import RELATIONS

OPENERS = ("What is {d}?", "Name {d}.", "Identify {d}.", "Which one is {d}?")
PERSON_OPENERS = ("Who is {d}?", "Name {d}.", "Identify {d}.")
# Literal relations that can pin the last entity: fine-grained values (years, dates, numbers, codes), not
# coarse categories such as occupation or genre (their "the {v}" phrases would also read ambiguously).
PIN_RELATIONS = (
    "born_year", "founded_year", "launched_on", "published_year", "held_on", "population", "area_km2",
    "currency", "atomic_number", "symbol", "atomic_mass", "density",
)


@dataclasses.dataclass(frozen=True)
class Step:
    """One clause of a parsed question: the entity it describes is the `unknown` side ("s" or "o") of
    `relation`; the other side is the previous step's entity, or `value` for the innermost literal step."""

    relation: str
    unknown: str
    value: str | None = None  # the literal (innermost step only)
    cohort: str = ""  # went_through's {c}


def describe(relation: str, unknown: str, slot: str, cohort: str = "") -> str:
    """The phrase naming the `unknown` side of `relation` through `slot` (a name, a description or a value)."""
    spec = RELATIONS[relation]
    if unknown == "s":
        return spec.describe_subject.format(o=slot, v=slot, c=cohort, s="")
    return spec.describe_object.format(s=slot, c=cohort, o="", v="")


def _template_regex(template: str) -> re.Pattern:
    """'the company from the {c} cohort of {o}' -> ^the company from the (?P<c>.+?) cohort of (?P<slot>.+)$"""
    out, pos = [], 0
    for m in re.finditer(r"\{([sovc])\}", template):
        out.append(re.escape(template[pos:m.start()]))
        out.append("(?P<c>.+?)" if m.group(1) == "c" else "(?P<slot>.+)")
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return re.compile("^" + "".join(out) + "$")


@lru_cache(maxsize=1)
def _patterns() -> tuple[tuple[str, str, bool, re.Pattern], ...]:
    """(relation, unknown side, slot is literal, regex) for every describe template a question may use."""
    out = []
    for name, spec in RELATIONS.items():
        if spec.literal and name not in PIN_RELATIONS:
            continue
        out.append((name, "s", spec.literal, _template_regex(spec.describe_subject)))
        if not spec.literal:
            out.append((name, "o", False, _template_regex(spec.describe_object)))
    return tuple(out)


def _is_description(text: str) -> bool:
    return text.startswith(("the ", "a "))


def parse_description(text: str, max_depth: int = 6) -> list[list[Step]]:
    """Every reading of a nested description as steps, innermost first (empty when none).

    An entity slot must itself read as a description; a literal slot must not (so "the person born in
    1967" is born_year and "the person born in the capital of …" is born_in).
    """
    if max_depth == 0:
        return []
    readings = []
    for relation, unknown, literal, pattern in _patterns():
        m = pattern.match(text)
        if m is None:
            continue
        slot, cohort = m.group("slot"), (m.groupdict().get("c") or "")
        if literal:
            if not _is_description(slot) and slot:
                readings.append([Step(relation, unknown, value=slot, cohort=cohort)])
            continue
        for inner in parse_description(slot, max_depth - 1):
            readings.append(inner + [Step(relation, unknown, cohort=cohort)])
    return readings


_OPENER_RES = tuple(
    re.compile("^" + re.escape(o).replace(re.escape("{d}"), "(?P<d>.+)") + "$")
    for o in dict.fromkeys(OPENERS + PERSON_OPENERS)
)


def strip_opener(question: str) -> str | None:
    """The description inside a question written by `write_question` (None if no opener matches)."""
    for pattern in _OPENER_RES:
        m = pattern.match(question)
        if m:
            return m.group("d")
    return None


def parse_question(question: str) -> list[list[Step]]:
    """All readings of a generated question (see `parse_description`)."""
    inner = strip_opener(question)
    return [] if inner is None else parse_description(inner)


def write_question(description: str, answer_type: str, opener_index: int) -> str:
    openers = PERSON_OPENERS if answer_type == "person" else OPENERS
    return openers[opener_index % len(openers)].format(d=description)


def mentions(text: str, name: str) -> bool:
    """Whether `name` occurs in `text` as whole words (case-insensitive)."""
    if not name.strip():
        return False
    return re.search(r"(?<!\w)" + re.escape(name.casefold()) + r"(?!\w)", text.casefold()) is not None
