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
   or alias of any chain entity may appear in it.
4. Verification: the KB solver must find exactly the answer, and the search solver (search_web only) must
   agree. Rejections are counted by reason.
Format-diversity copies add an explicit format instruction, keep the answer, and are flagged augmented.

Output record (one JSONL object): id, question, answer (the answer entity's name), aliases (its other names),
hops (h, the number of statements the question nests: h-1 links plus the literal pin), chain (h items
{entity, relation} from the answer entity outward: `entity` is a KB id; `relation` joins it to the next chain
entity, written "rel" when this entity is the relation's subject and "^rel" when it is its object; the last
item's relation is the literal pin), seed (the seed entity's id), verified_by (solver names), split, augmented.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

from tqdm import tqdm

from searchjax.data.jsonl import require
from searchjax.data.questions import PIN_RELATIONS, describe, mentions, write_question
from searchjax.data.solvers import KBSolver, SearchSolver
from searchjax.search.world import RELATIONS, Entity, KnowledgeBase, Relation

RECORD_FIELDS = ("id", "question", "answer", "aliases", "hops", "chain", "seed", "verified_by", "split",
                 "augmented")
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

    def __post_init__(self):
        # TypeError, as searchjax.config expects of __post_init__ checks: load_yaml names the file then.
        if not 2 <= self.min_hops <= self.max_hops <= 6:
            raise TypeError(f"SynthConfig: need 2 <= min_hops <= max_hops <= 6, got {self.min_hops}-{self.max_hops}")
        if not 0 <= self.augment_fraction <= 1 or not 0 <= self.dev_fraction < 1:
            raise TypeError(f"SynthConfig: augment_fraction must be in [0, 1] and dev_fraction in [0, 1), got "
                            f"{self.augment_fraction} and {self.dev_fraction}")
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


def chain_description(kb: KnowledgeBase, links: list[Link]) -> str:
    """D(0) of the module docstring, built from the innermost (literal) link outward."""
    text = ""
    for link in reversed(links):
        r = link.relation
        slot = r.value if link.next_id is None else text
        text = describe(r.relation, link.side, slot, r.attrs.get("cohort", ""))
    return text


def chain_record(links: list[Link]) -> list[dict[str, str]]:
    return [{"entity": x.entity, "relation": ("" if x.side == "s" else "^") + x.relation.relation} for x in links]


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
        self._seen: set[str] = set()

    def attempt(self, rng: random.Random, hops: int) -> tuple[dict[str, Any] | None, str]:
        """One try: expand, write, check, verify. Returns (record, "") or (None, rejection reason)."""
        seed = rng.choice(self.expander.seeds)
        links, reason = self.expander.expand(seed, hops, rng)
        if links is None:
            return None, reason
        question = write_question(chain_description(self.kb, links), seed.type, rng.randrange(4))
        ids = [x.entity for x in links]
        if not entity_free(self.kb, question, ids):
            return None, "entity_leak"
        if question in self._seen:
            return None, "duplicate"
        kb_answer, reason = self.kb_solver.solve(question)
        if kb_answer is None:
            return None, reason
        if kb_answer != seed.name:
            return None, "kb_disagrees"
        verified_by = [self.kb_solver.name]
        if self.search is not None:
            trace = self.search.solve(question)
            if trace.answer is None:
                return None, trace.reason
            if not is_answer(trace.answer, seed):
                return None, "search_disagrees"
            verified_by.append(self.search.name)
        self._seen.add(question)
        return {
            "id": "", "question": question, "answer": seed.name, "aliases": list(seed.aliases), "hops": hops,
            "chain": chain_record(links), "seed": seed.id, "verified_by": verified_by,
            "split": _split(seed.id, self.cfg.seed, self.cfg.dev_fraction), "augmented": False,
        }, ""

    def generate(self, progress: bool = False) -> Iterator[dict[str, Any]]:
        """Yield `cfg.n` verified questions plus their augmented copies (deterministic for cfg.seed)."""
        cfg = self.cfg
        for k in tqdm(range(cfg.n), desc="synth-qa", unit="q", disable=not progress):
            rng = random.Random(f"{cfg.seed}:{k}")
            hops = cfg.min_hops + k % (cfg.max_hops - cfg.min_hops + 1)
            for _ in range(cfg.max_attempts_per_question):
                record, reason = self.attempt(rng, hops)
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


def augment(record: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A copy with an explicit format instruction and the same answer, flagged augmented."""
    fmt, instruction = rng.choice(FORMAT_INSTRUCTIONS)
    return {**record, "id": f"{record['id']}-{fmt}", "question": f"{record['question']} {instruction}",
            "augmented": True}


def validate_qa_record(row: dict[str, Any]) -> None:
    """Schema check of one synthetic QA row (exactly RECORD_FIELDS)."""
    if set(row) != set(RECORD_FIELDS):
        raise ValueError(f"fields {sorted(row)} differ from the schema {sorted(RECORD_FIELDS)}")
    for field, kind in (("id", str), ("question", str), ("answer", str), ("aliases", list), ("hops", int),
                        ("chain", list), ("seed", str), ("verified_by", list), ("split", str),
                        ("augmented", bool)):
        require(row, field, kind)
    if len(row["chain"]) != row["hops"]:
        raise ValueError(f"chain has {len(row['chain'])} items, hops is {row['hops']}")
