"""Verifiable multi-hop QA by sequential expansion over the offline world (RECIPE.md §3.1, after WebShaper).

1. Seed selection: the seed is an entity that at least two documents confirm (`KnowledgeBase.confirmed(2)`: it
   has ≥2 pages and each of its relations is stated by ≥2 documents); its atomic statements are its relations.
   The seed is the answer entity e_0.
2. Chain: from e_i follow a relation (either direction) to a new, distinct entity e_{i+1}, stated by ≥2
   documents, such that e_i is the only entity in that relation with e_{i+1} (so no link is ambiguous), for
   h-1 links; then pin e_{h-1} by a literal relation whose value no other entity shares. The walk is a
   depth-first search in random order with a bounded number of expansions, so dead ends backtrack. Every statement
   mentions at most one chain entity besides a literal, so no single statement gives the answer away.
3. Entity-free question: names replaced recursively by describing phrases (searchjax.data.questions); no name
   or alias of any chain entity may appear in it. A description is asked with at most `phrasings` openers ("Name
   ..." / "What is ...?" / ...; 1 by default: once), a question at most once; anything more is a duplicate.
   Phrasings of one chain share its seed entity, hence its split: held-out sets take one question per chain.
4. Verification: the KB solver must find exactly the answer, and the search solver (search_web only) must
   agree. Rejections are counted by reason.
Format-diversity copies add an explicit format instruction, keep the answer, and are flagged augmented.
Renderings in other languages (`SynthConfig.languages`, e.g. sv and ja besides en) follow each verified question:
the same chain written through the language's phrases (searchjax.data.questions), the same answer (an entity
name), verified through the English original; they carry `language` and the id suffix -LANG. Unanswerable
copies (`SynthConfig.unanswerable_fraction`) replace the chain's literal pin by a year or date that no entity
holds, so the question describes an entity that does not exist (the KB solver finds no answer): answer "",
answerable false, id suffix -none. Neither kind draws from the main random stream, so the English output of a
seed is the same with or without them.

Output record (one JSONL object): id, question, answer (the answer entity's name), aliases (its other names),
hops (h, the number of statements the question nests: h-1 links plus the literal pin), chain (h items
{entity, relation} from the answer entity outward: `entity` is a KB id; `relation` joins it to the next chain
entity, written "rel" when this entity is the relation's subject and "^rel" when it is its object; the last
item's relation is the literal pin), seed (the seed entity's id), verified_by (solver names), split, augmented;
renderings add language (ISO 639-1), unanswerable copies add answerable (false).
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from tqdm import tqdm

from searchjax.data.jsonl import require
from searchjax.data.questions import (OPENERS, PIN_RELATIONS, QUESTION_LANGUAGES, describe, localise_value,
                                      mentions, write_question)
from searchjax.data.solvers import KBSolver, SearchSolver
from searchjax.search.world import RELATIONS, Entity, KnowledgeBase, Relation

RECORD_FIELDS = ("id", "question", "answer", "aliases", "hops", "chain", "seed", "verified_by", "split",
                 "augmented")
OPTIONAL_FIELDS = ("language", "answerable")  # on renderings in other languages and on unanswerable copies
FORMAT_INSTRUCTIONS = (
    ("list", "Show a list of the entities you pass through on the way, ending with the answer."),
    ("table", "Answer in a table with one row per step and the answer in the last row."),
    ("sentence", "Answer in one sentence."),
)


@dataclasses.dataclass(frozen=True)
class SynthConfig:
    """Synthetic QA options (configs/data/synth_qa.yaml)."""

    n: int = 1000
    seed: int = 0
    min_hops: int = 2
    max_hops: int = 4
    min_docs: int = 2
    augment_fraction: float = 0.2  # share of kept questions that also get one format-instruction copy
    dev_fraction: float = 0.05  # by answer entity, so no answer is in both splits
    max_attempts_per_question: int = 50
    search_max_calls: int = 5
    languages: tuple[str, ...] = ("en",)  # "en" first; others (sv, ja) add renderings of every kept question
    unanswerable_fraction: float = 0.0  # share of kept questions that also get an unanswerable copy
    phrasings: int = 1  # openers ("Name ..." / "What is ...?" / ...) a chain may be asked with, each once (1..4)

    def __post_init__(self):
        # TypeError, as searchjax.config expects of __post_init__ checks: load_yaml names the file then.
        if not 2 <= self.min_hops <= self.max_hops <= 6:
            raise TypeError(f"SynthConfig: need 2 <= min_hops <= max_hops <= 6, got {self.min_hops}-{self.max_hops}")
        if not 0 <= self.augment_fraction <= 1 or not 0 <= self.dev_fraction < 1:
            raise TypeError(f"SynthConfig: augment_fraction must be in [0, 1] and dev_fraction in [0, 1), got "
                            f"{self.augment_fraction} and {self.dev_fraction}")
        if not self.languages or self.languages[0] != "en" or not set(self.languages) <= set(QUESTION_LANGUAGES) \
                or len(set(self.languages)) != len(self.languages):
            raise TypeError(f"SynthConfig.languages: distinct codes from {list(QUESTION_LANGUAGES)} starting with "
                            f"'en', got {self.languages}")
        if not 0 <= self.unanswerable_fraction <= 1:
            raise TypeError(f"SynthConfig.unanswerable_fraction must be in [0, 1], got {self.unanswerable_fraction}")
        if not 1 <= self.phrasings <= len(OPENERS):
            raise TypeError(f"SynthConfig.phrasings must be in 1..{len(OPENERS)} (the openers), got {self.phrasings}")
        for name in ("n", "min_docs", "max_attempts_per_question", "search_max_calls"):
            if getattr(self, name) < 1:
                raise TypeError(f"SynthConfig.{name}: expected >= 1, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class Link:
    """The relation that describes chain entity `entity` through `next_id` (or a literal when next_id is None)."""

    entity: str
    relation: Relation
    side: str  # "s": entity is the relation's subject; "o": its object
    next_id: str | None


class Expander:
    """Builds chains from seeds (step 2 of the module docstring)."""

    def __init__(self, kb: KnowledgeBase, kb_solver: KBSolver, min_docs: int = 2, max_expansions: int = 40):
        self.kb, self.kb_solver, self.min_docs, self.max_expansions = kb, kb_solver, min_docs, max_expansions
        self._link_cache: dict[str, list[Link]] = {}
        self._pin_cache: dict[str, list[Relation]] = {}
        confirmed = sorted(kb.confirmed(min_docs), key=lambda e: e.id)
        self.seeds = [e for e in confirmed if self._links(e.id)]  # a seed must start at least one link
        if not self.seeds:
            raise ValueError(f"the knowledge base has no entity confirmed by {min_docs} documents with a link")

    def _links(self, entity_id: str) -> list[Link]:
        """Unambiguous links out of `entity_id` stated by >= min_docs documents (cached per entity)."""
        if entity_id not in self._link_cache:
            out = []
            for r in self.kb.relations_from(entity_id):
                if r.object and len(r.doc_ids) >= self.min_docs and \
                        self._only(self.kb.relations_to(r.object, r.relation), r, "s"):
                    out.append(Link(entity_id, r, "s", r.object))
            for r in self.kb.relations_to(entity_id):
                if len(r.doc_ids) >= self.min_docs and \
                        self._only(self.kb.relations_from(r.subject, r.relation), r, "o"):
                    out.append(Link(entity_id, r, "o", r.subject))
            self._link_cache[entity_id] = out
        return self._link_cache[entity_id]

    @staticmethod
    def _only(rels: list[Relation], r: Relation, side: str) -> bool:
        """Whether `r` is the only relation among `rels` that the describing phrase of `side` can mean (the
        subject phrase of went_through names the cohort, the object phrase does not)."""
        spec = RELATIONS[r.relation]
        if "{c}" not in (spec.describe_subject if side == "s" else spec.describe_object):
            return len(rels) == 1
        cohort = r.attrs.get("cohort", "")
        return sum(x.attrs.get("cohort", "") == cohort for x in rels) == 1

    def _pins(self, entity_id: str) -> list[Relation]:
        if entity_id not in self._pin_cache:
            self._pin_cache[entity_id] = [
                r for r in self.kb.relations_from(entity_id)
                if r.relation in PIN_RELATIONS and len(r.doc_ids) >= self.min_docs
                and len(self.kb_solver.holders(r.relation, r.value)) == 1]
        return self._pin_cache[entity_id]

    def _walk(self, current: str, remaining: int, visited: frozenset[str], rng: random.Random,
              budget: list[int]) -> list[Link] | None:
        """Depth-first, in random order, with a budget of `budget[0]` expansions: the links to a pinned end."""
        if remaining == 0:
            pins = self._pins(current)
            return [Link(current, rng.choice(pins), "s", None)] if pins else None
        options = [x for x in self._links(current) if x.next_id not in visited]
        rng.shuffle(options)
        for link in options:
            if budget[0] <= 0:
                return None
            budget[0] -= 1
            rest = self._walk(link.next_id, remaining - 1, visited | {link.next_id}, rng, budget)
            if rest is not None:
                return [link, *rest]
        return None

    def expand(self, seed: Entity, hops: int, rng: random.Random) -> tuple[list[Link] | None, str]:
        """h-1 distinct links from `seed` plus a literal pin, or (None, "no_chain")."""
        links = self._walk(seed.id, hops - 1, frozenset({seed.id}), rng, [self.max_expansions])
        return (links, "") if links is not None else (None, "no_chain")


def chain_description(kb: KnowledgeBase, links: list[Link], language: str = "en", pin_value: str | None = None) -> str:
    """D(0) of the module docstring, built from the innermost (literal) link outward, in `language`;
    `pin_value` replaces the literal pin's value (unanswerable copies)."""
    text = ""
    for link in reversed(links):
        r = link.relation
        if link.next_id is None:
            slot = localise_value(r.relation, r.value if pin_value is None else pin_value, language)
        else:
            slot = text
        text = describe(r.relation, link.side, slot, r.attrs.get("cohort", ""), language)
    return text


def chain_record(links: list[Link]) -> list[dict[str, str]]:
    return [{"entity": x.entity, "relation": ("" if x.side == "s" else "^") + x.relation.relation} for x in links]


def chain_key(record: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """What a QA record asks, apart from its wording: its chain's (entity, relation) pairs."""
    return tuple((x["entity"], x["relation"]) for x in record["chain"])


def one_per_chain(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first record of each chain (`chain_key`), in order: a held-out set that counts every chain once."""
    first: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for r in records:
        first.setdefault(chain_key(r), r)
    return list(first.values())


def entity_free(kb: KnowledgeBase, question: str, entity_ids: list[str]) -> bool:
    """No name or alias of any of `entity_ids` occurs in `question`."""
    for eid in entity_ids:
        e = kb.entity(eid)
        if any(mentions(question, n) for n in (e.name, *e.aliases)):
            return False
    return True


def is_answer(text: str, entity: Entity) -> bool:
    """Whether `text` names `entity` (its name or an alias, case-insensitive)."""
    return text.strip().casefold() in {n.casefold() for n in (entity.name, *entity.aliases)}


def _split(entity_id: str, seed: int, dev_fraction: float) -> str:
    return "dev" if zlib.crc32(f"{seed}:{entity_id}".encode()) % 10_000 < dev_fraction * 10_000 else "train"


class QAGenerator:
    """Generates verified questions; `summary` counts kept and rejected questions by reason."""

    def __init__(self, kb: KnowledgeBase, search: SearchSolver | None, cfg: SynthConfig):
        """`search=None` verifies by the KB solver alone (to measure the search solver on unfiltered questions);
        the CLI and training data always use both."""
        self.kb, self.cfg = kb, cfg
        self.kb_solver = KBSolver(kb)
        self.search = search
        self.expander = Expander(kb, self.kb_solver, cfg.min_docs)
        self.summary: Counter = Counter()
        self._seen: dict[str, set[str]] = {}  # chain description -> the questions that asked it

    def attempt(self, rng: random.Random, hops: int) -> tuple[dict[str, Any] | None, str]:
        """One try: expand, write, check, verify. Returns (record, "") or (None, rejection reason)."""
        record, _, reason = self._attempt(rng, hops)
        return record, reason

    def _attempt(self, rng: random.Random, hops: int) -> tuple[dict[str, Any] | None, tuple, str]:
        """`attempt`, also returning (links, answer type, opener index) for the renderings of the question."""
        seed = rng.choice(self.expander.seeds)
        links, reason = self.expander.expand(seed, hops, rng)
        if links is None:
            return None, (), reason
        opener = rng.randrange(4)
        description = chain_description(self.kb, links)
        question = write_question(description, seed.type, opener)
        ids = [x.entity for x in links]
        if not entity_free(self.kb, question, ids):
            return None, (), "entity_leak"
        asked = self._seen.get(description, set())
        if question in asked or len(asked) >= self.cfg.phrasings:  # the same question, or this chain enough times
            return None, (), "duplicate"
        kb_answer, reason = self.kb_solver.solve(question)
        if kb_answer is None:
            return None, (), reason
        if kb_answer != seed.name:
            return None, (), "kb_disagrees"
        verified_by = [self.kb_solver.name]
        if self.search is not None:
            trace = self.search.solve(question)
            if trace.answer is None:
                return None, (), trace.reason
            if not is_answer(trace.answer, seed):
                return None, (), "search_disagrees"
            verified_by.append(self.search.name)
        self._seen.setdefault(description, set()).add(question)
        return {
            "id": "", "question": question, "answer": seed.name, "aliases": list(seed.aliases), "hops": hops,
            "chain": chain_record(links), "seed": seed.id, "verified_by": verified_by,
            "split": _split(seed.id, self.cfg.seed, self.cfg.dev_fraction), "augmented": False,
        }, (links, seed.type, opener), ""

    def renderings(self, record: dict[str, Any], links: list[Link], answer_type: str,
                   opener: int) -> Iterator[dict[str, Any]]:
        """The record's question in each extra language of cfg.languages (same chain, same answer)."""
        for language in self.cfg.languages[1:]:
            question = write_question(chain_description(self.kb, links, language), answer_type, opener, language)
            if not entity_free(self.kb, question, [x.entity for x in links]):
                self.summary[f"rejected:entity_leak_{language}"] += 1
                continue
            yield {**record, "id": f"{record['id']}-{language}", "question": question, "language": language}

    def unanswerable(self, record: dict[str, Any], links: list[Link], answer_type: str, opener: int,
                     rng: random.Random) -> dict[str, Any] | None:
        """A copy whose literal pin is a year or date no entity holds (None when the pin is neither)."""
        pin = links[-1].relation
        fake = _absent_value(pin.relation, pin.value, rng)
        if fake is None or self.kb_solver.holders(pin.relation, fake):
            return None
        question = write_question(chain_description(self.kb, links, pin_value=fake), answer_type, opener)
        if self.kb_solver.solve(question) != (None, "kb_no_answer"):
            return None
        return {**record, "id": f"{record['id']}-none", "question": question, "answer": "", "aliases": [],
                "verified_by": [self.kb_solver.name], "answerable": False}

    def generate(self, progress: bool = False) -> Iterator[dict[str, Any]]:
        """Yield `cfg.n` verified questions plus their augmented copies (deterministic for cfg.seed)."""
        cfg = self.cfg
        for k in tqdm(range(cfg.n), desc="synth-qa", unit="q", disable=not progress):
            rng = random.Random(f"{cfg.seed}:{k}")
            hops = cfg.min_hops + k % (cfg.max_hops - cfg.min_hops + 1)
            for _ in range(cfg.max_attempts_per_question):
                record, rendering, reason = self._attempt(rng, hops)
                if record is not None:
                    break
                self.summary[f"rejected:{reason}"] += 1
            else:
                self.summary["gave_up"] += 1
                continue
            record["id"] = f"sqa-{cfg.seed}-{k:06d}"
            self.summary["kept"] += 1
            yield record
            if rng.random() < cfg.augment_fraction:
                self.summary["augmented"] += 1
                yield augment(record, rng)
            yield from self._extras(record, rendering, k)

    def _extras(self, record: dict[str, Any], rendering: tuple, k: int) -> Iterator[dict[str, Any]]:
        """Renderings and the unanswerable copy of a kept record, from random streams of their own."""
        for extra in self.renderings(record, *rendering):
            self.summary[f"rendered:{extra['language']}"] += 1
            yield extra
        rng = random.Random(f"{self.cfg.seed}:{k}:unanswerable")
        if self.cfg.unanswerable_fraction and rng.random() < self.cfg.unanswerable_fraction:
            extra = self.unanswerable(record, *rendering, rng)
            self.summary["unanswerable" if extra is not None else "rejected:unanswerable_pin"] += 1
            if extra is not None:
                yield extra


def augment(record: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A copy with an explicit format instruction and the same answer, flagged augmented."""
    fmt, instruction = rng.choice(FORMAT_INSTRUCTIONS)
    return {**record, "id": f"{record['id']}-{fmt}", "question": f"{record['question']} {instruction}",
            "augmented": True}


_YEAR_PINS = ("born_year", "founded_year", "published_year")
_DATE_PINS = ("launched_on", "held_on")


def _absent_value(relation: str, value: str, rng: random.Random) -> str | None:
    """A year (or a date with that year) from 1800-1899, before anything in the world, for a year or date pin."""
    year = str(rng.randint(1800, 1899))
    if relation in _YEAR_PINS:
        return year
    if relation in _DATE_PINS:
        return value.rsplit(" ", 1)[0] + " " + year
    return None


def validate_qa_record(row: dict[str, Any]) -> None:
    """Schema check of one synthetic QA row (RECORD_FIELDS, and OPTIONAL_FIELDS where present)."""
    if set(row) - set(OPTIONAL_FIELDS) != set(RECORD_FIELDS):
        raise ValueError(f"fields {sorted(row)} differ from the schema {sorted(RECORD_FIELDS)} (optional: "
                         f"{list(OPTIONAL_FIELDS)})")
    if "language" in row and row["language"] not in QUESTION_LANGUAGES:
        raise ValueError(f"field 'language': {row['language']!r} is not one of {list(QUESTION_LANGUAGES)}")
    if "answerable" in row and not isinstance(row["answerable"], bool):
        raise TypeError(f"field 'answerable': expected bool, got {row['answerable']!r:.40}")
    for field, kind in (("id", str), ("question", str), ("answer", str), ("aliases", list), ("hops", int),
                        ("chain", list), ("seed", str), ("verified_by", list), ("split", str),
                        ("augmented", bool)):
        require(row, field, kind)
    if len(row["chain"]) != row["hops"]:
        raise ValueError(f"chain has {len(row['chain'])} items, hops is {row['hops']}")
