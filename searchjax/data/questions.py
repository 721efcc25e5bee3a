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

Renderings in other languages (QUESTION_LANGUAGES: Swedish and Japanese besides English) nest the same chain
through translated phrases and openers; literal values are localised (month names, Japanese 年/月/日 dates,
cohort seasons), entity names never appear, and the answer stays the entity's name. Only English is parsed
back: a rendering is verified through its English original.
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


def describe(relation: str, unknown: str, slot: str, cohort: str = "", language: str = "en") -> str:
    """The phrase naming the `unknown` side of `relation` through `slot` (a name, a description or a value), in
    `language` (one of QUESTION_LANGUAGES; a literal slot should come through `localise_value`)."""
    if language != "en":
        template = _phrase(language, relation, unknown)
        return template.format(o=slot, s=slot, v=slot, c=localise_cohort(cohort, language))
    spec = RELATIONS[relation]
    if unknown == "s":
        return spec.describe_subject.format(o=slot, v=slot, c=cohort, s="")
    return spec.describe_object.format(s=slot, c=cohort, o="", v="")


# ------------------------------------------------------------------------------------------ other languages
QUESTION_LANGUAGES = ("en", "sv", "ja")
_TRANSLATED_OPENERS = {
    "sv": (("Vad är {d}?", "Nämn {d}.", "Identifiera {d}.", "Vilken är {d}?"),
           ("Vem är {d}?", "Nämn {d}.", "Identifiera {d}.")),
    "ja": (("{d}は何ですか？", "{d}を挙げてください。", "{d}を特定してください。", "{d}はどれですか？"),
           ("{d}は誰ですか？", "{d}を挙げてください。", "{d}を特定してください。")),
}
# relation -> (subject phrase, object phrase) for every relation a question can use: the entity relations both
# ways, the pin relations (literal) on their subject side only.
_PHRASES = {
    "sv": {
        "located_in": ("en plats i {o}", "platsen där {s} ligger"),
        "capital_of": ("huvudstaden i {o}", "landet vars huvudstad är {s}"),
        "borders": ("ett land som gränsar till {o}", "en granne till {s}"),
        "born_in": ("personen som föddes i {o}", "födelseorten för {s}"),
        "member_of": ("en medlem av {o}", "organisationen som {s} tillhör"),
        "founded": ("grundaren av {o}", "organisationen som grundades av {s}"),
        "headquartered_in": ("organisationen med säte i {o}", "staden där {s} har sitt säte"),
        "went_through": ("företaget från kullen {c} hos {o}", "acceleratorn som {s} gick igenom"),
        "wrote": ("författaren till {o}", "boken skriven av {s}"),
        "published_by": ("boken utgiven av {o}", "förlaget som gav ut {s}"),
        "held_in": ("evenemanget som hölls i {o}", "staden som stod värd för {s}"),
        "organised_by": ("evenemanget som anordnades av {o}", "arrangören av {s}"),
        "spoke_at": ("en talare vid {o}", "evenemanget där {s} talade"),
        "born_year": ("personen som föddes {v}", None),
        "founded_year": ("organisationen som grundades {v}", None),
        "launched_on": ("acceleratorn som startade i {v}", None),
        "published_year": ("boken utgiven {v}", None),
        "held_on": ("evenemanget som hölls den {v}", None),
        "population": ("platsen med en befolkning på {v}", None),
        "area_km2": ("landet med en yta på {v} kvadratkilometer", None),
        "currency": ("landet som använder valutan {v}", None),
        "atomic_number": ("grundämnet med atomnummer {v}", None),
        "symbol": ("grundämnet med den kemiska beteckningen {v}", None),
        "atomic_mass": ("grundämnet med atommassan {v}", None),
        "density": ("grundämnet med densiteten {v} g/cm3", None),
    },
    "ja": {
        "located_in": ("{o}にある場所", "{s}がある場所"),
        "capital_of": ("{o}の首都", "首都が{s}である国"),
        "borders": ("{o}と国境を接する国", "{s}の隣国"),
        "born_in": ("{o}で生まれた人物", "{s}の出生地"),
        "member_of": ("{o}のメンバー", "{s}が所属する組織"),
        "founded": ("{o}の創設者", "{s}が創設した組織"),
        "headquartered_in": ("{o}に本拠を置く組織", "{s}が本拠を置く都市"),
        "went_through": ("{o}の{c}のコホートに参加した企業", "{s}が参加したアクセラレーター"),
        "wrote": ("{o}の著者", "{s}が書いた本"),
        "published_by": ("{o}が出版した本", "{s}の出版社"),
        "held_in": ("{o}で開催されたイベント", "{s}が開催された都市"),
        "organised_by": ("{o}が主催したイベント", "{s}の主催者"),
        "spoke_at": ("{o}の講演者", "{s}が講演したイベント"),
        "born_year": ("{v}に生まれた人物", None),
        "founded_year": ("{v}に設立された組織", None),
        "launched_on": ("{v}に開始されたアクセラレーター", None),
        "published_year": ("{v}に出版された本", None),
        "held_on": ("{v}に開催されたイベント", None),
        "population": ("人口{v}人の場所", None),
        "area_km2": ("面積{v}平方キロメートルの国", None),
        "currency": ("{v}を使用する国", None),
        "atomic_number": ("原子番号{v}の元素", None),
        "symbol": ("元素記号が{v}の元素", None),
        "atomic_mass": ("原子量{v}の元素", None),
        "density": ("密度{v} g/cm3の元素", None),
    },
}
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_SV_MONTHS = ("januari", "februari", "mars", "april", "maj", "juni", "juli", "augusti", "september", "oktober",
              "november", "december")
_SEASONS = {"sv": {"summer": "sommaren", "winter": "vintern"}, "ja": {"summer": "夏", "winter": "冬"}}
_YEAR_RELATIONS = ("born_year", "founded_year", "published_year")
_DATE_RE = re.compile(r"^(?:(\d{1,2}) )?(" + "|".join(_MONTHS) + r") (\d{4})$")


def _phrase(language: str, relation: str, unknown: str) -> str:
    if language not in _PHRASES:
        raise ValueError(f"unknown question language {language!r}; expected one of {list(QUESTION_LANGUAGES)}")
    pair = _PHRASES[language].get(relation)
    template = None if pair is None else pair[0 if unknown == "s" else 1]
    if template is None:
        raise ValueError(f"no {language} phrase for the {'subject' if unknown == 's' else 'object'} of {relation!r}")
    return template


def localise_value(relation: str, value: str, language: str) -> str:
    """A literal value as `language` writes it: month names, Japanese dates and years, Swedish digit groups."""
    if language == "en":
        return value
    m = _DATE_RE.match(value)
    if m:
        day, month, year = m.group(1), _MONTHS.index(m.group(2)), m.group(3)
        if language == "ja":
            return f"{year}年{month + 1}月" + (f"{int(day)}日" if day else "")
        return (f"{int(day)} " if day else "") + f"{_SV_MONTHS[month]} {year}"
    if language == "ja" and relation in _YEAR_RELATIONS:
        return f"{value}年"
    if language == "sv" and re.fullmatch(r"\d{1,3}(?:,\d{3})+", value):
        return value.replace(",", " ")
    return value


def localise_cohort(cohort: str, language: str) -> str:
    """'summer 2007' -> 'sommaren 2007' (sv), '2007年夏' (ja)."""
    season, _, year = cohort.partition(" ")
    if language == "en" or season not in _SEASONS.get(language, {}):
        return cohort
    word = _SEASONS[language][season]
    return f"{year}年{word}" if language == "ja" else f"{word} {year}"


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


def write_question(description: str, answer_type: str, opener_index: int, language: str = "en") -> str:
    if language == "en":
        openers = PERSON_OPENERS if answer_type == "person" else OPENERS
    else:
        if language not in _TRANSLATED_OPENERS:
            raise ValueError(f"unknown question language {language!r}; expected one of {list(QUESTION_LANGUAGES)}")
        general, person = _TRANSLATED_OPENERS[language]
        openers = person if answer_type == "person" else general
    return openers[opener_index % len(openers)].format(d=description)


def mentions(text: str, name: str) -> bool:
    """Whether `name` occurs in `text` as whole words (case-insensitive)."""
    if not name.strip():
        return False
    return re.search(r"(?<!\w)" + re.escape(name.casefold()) + r"(?!\w)", text.casefold()) is not None
