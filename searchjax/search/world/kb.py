"""The knowledge base of a built world: typed entities, relations, and which documents state each relation.

See searchjax.search.world for the on-disk format (DIR/kb.jsonl). `KnowledgeBase.load(DIR)` gives the
lookups the QA generator needs: entity by id or name, relations from/to an entity, entities that at least n
documents confirm, and the canonical atomic statement / describing phrase of a relation.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path

from searchjax.data.jsonl import iter_jsonl
from searchjax.search.types import iter_corpus
from searchjax.search.world.schema import RELATIONS, template_fields

KB_FILE = "kb.jsonl"
CORPUS_FILE = "corpus.jsonl"
MANIFEST_FILE = "world.json"


@dataclasses.dataclass(frozen=True)
class Entity:
    id: str
    type: str
    name: str
    aliases: tuple[str, ...]
    attrs: dict
    part: str  # "fictional" or "real"
    doc_ids: tuple[str, ...]  # documents about this entity (its own pages)


@dataclasses.dataclass(frozen=True)
class Relation:
    subject: str
    relation: str
    object: str | None  # an entity id, or None for a literal-valued relation
    value: str | None  # the literal value, or None when `object` is set
    attrs: dict
    doc_ids: tuple[str, ...]  # every document whose text states this relation

    @property
    def literal(self) -> bool:
        return self.object is None


def _check_record(row: dict) -> None:
    kind = row.get("kind")
    if kind == "entity":
        for field in ("id", "type", "name", "part"):
            if not isinstance(row.get(field), str):
                raise TypeError(f"entity field {field!r} must be a string, got {row.get(field)!r}")
    elif kind == "relation":
        if row.get("relation") not in RELATIONS:
            raise ValueError(f"unknown relation {row.get('relation')!r}; known: {sorted(RELATIONS)}")
        if (row.get("object") is None) == (row.get("value") is None):
            raise ValueError("a relation needs exactly one of 'object' (entity id) and 'value' (literal)")
    else:
        raise ValueError(f"field 'kind' must be 'entity' or 'relation', got {kind!r}")


def entity_record(e: dict) -> dict:
    keys = ("id", "type", "name", "aliases", "attrs", "part", "doc_ids")
    return {"kind": "entity", **{k: e[k] for k in keys}}


def relation_record(r: dict) -> dict:
    keys = ("subject", "relation", "object", "value", "attrs", "doc_ids")
    return {"kind": "relation", **{k: r[k] for k in keys}}


class KnowledgeBase:
    """Entities and relations of a world with the lookups multi-hop question generation needs."""

    def __init__(self, entities: list[Entity], relations: list[Relation], world_dir: Path | None = None):
        self.world_dir = world_dir
        self.entities: dict[str, Entity] = {e.id: e for e in entities}
        self.relations = relations
        self._from: dict[str, list[Relation]] = defaultdict(list)
        self._to: dict[str, list[Relation]] = defaultdict(list)
        self._by_name: dict[str, list[Entity]] = defaultdict(list)
        self._by_type: dict[str, list[Entity]] = defaultdict(list)
        for r in relations:
            for end in (r.subject, r.object):
                if end is not None and end not in self.entities:
                    raise ValueError(f"relation {r.relation} refers to unknown entity {end!r}")
            self._from[r.subject].append(r)
            if r.object is not None:
                self._to[r.object].append(r)
        for e in entities:
            self._by_type[e.type].append(e)
            for name in (e.name, *e.aliases):
                self._by_name[name.casefold()].append(e)
        self._docs: dict[str, dict] | None = None
        self._url_ids: dict[str, str] = {}

    @classmethod
    def load(cls, world_dir: str | Path) -> "KnowledgeBase":
        """Read DIR/kb.jsonl (raises searchjax.data.jsonl.DataError naming file:line for a bad record)."""
        world_dir = Path(world_dir)
        entities, relations = [], []
        for row in iter_jsonl(world_dir / KB_FILE, validate=_check_record):
            if row["kind"] == "entity":
                entities.append(Entity(row["id"], row["type"], row["name"], tuple(row.get("aliases", ())),
                                       dict(row.get("attrs", {})), row["part"], tuple(row.get("doc_ids", ()))))
            else:
                relations.append(Relation(row["subject"], row["relation"], row["object"], row["value"],
                                          dict(row.get("attrs", {})), tuple(row.get("doc_ids", ()))))
        return cls(entities, relations, world_dir)

    def entity(self, entity_id: str) -> Entity:
        try:
            return self.entities[entity_id]
        except KeyError:
            raise KeyError(f"no entity {entity_id!r} in the knowledge base") from None

    def by_type(self, entity_type: str) -> list[Entity]:
        return list(self._by_type.get(entity_type, ()))

    def by_name(self, name: str) -> list[Entity]:
        """Entities whose name or an alias equals `name` (case-insensitive)."""
        return list(self._by_name.get(name.casefold(), ()))

    def relations_from(self, entity_id: str, relation: str | None = None) -> list[Relation]:
        return [r for r in self._from.get(entity_id, ()) if relation is None or r.relation == relation]

    def relations_to(self, entity_id: str, relation: str | None = None) -> list[Relation]:
        return [r for r in self._to.get(entity_id, ()) if relation is None or r.relation == relation]

    def confirmed(self, min_docs: int = 2) -> list[Entity]:
        """Entities with at least `min_docs` documents of their own, each relation stated by >= min_docs."""
        out = []
        for e in self.entities.values():
            rels = self._from.get(e.id, ())
            if len(e.doc_ids) >= min_docs and rels and all(len(r.doc_ids) >= min_docs for r in rels):
                out.append(e)
        return out

    def _names(self, r: Relation) -> dict[str, str]:
        obj = self.entities[r.object].name if r.object else None
        return template_fields(self.entities[r.subject].name, obj, r.value, r.attrs.get("cohort", ""))

    def statement(self, r: Relation) -> str:
        """The canonical atomic statement of `r`, e.g. "Mara Velin wrote The Glass Orchard."."""
        return RELATIONS[r.relation].forward[0].format(**self._names(r))

    def describe_subject(self, r: Relation) -> str:
        """A phrase naming r's subject through its object: "the author of The Glass Orchard"."""
        return RELATIONS[r.relation].describe_subject.format(**self._names(r))

    def describe_object(self, r: Relation) -> str:
        """A phrase naming r's object (or value) through its subject: "the book written by Mara Velin"."""
        return RELATIONS[r.relation].describe_object.format(**self._names(r))

    def _corpus(self) -> tuple[dict[str, dict], dict[str, str]]:
        if self._docs is None:
            if self.world_dir is None:
                raise ValueError("this knowledge base was not loaded from a world directory")
            self._docs = {d["id"]: d for d in iter_corpus(self.world_dir / CORPUS_FILE)}
            self._url_ids = {d["url"]: i for i, d in self._docs.items()}
        return self._docs, self._url_ids

    def document(self, doc_id: str) -> dict:
        """The corpus row {id, about, title, url, text} of `doc_id` (the corpus is read on first use)."""
        return self._corpus()[0][doc_id]

    def doc_id_for_url(self, url: str) -> str:
        """The id of the document at `url` (search results carry urls)."""
        return self._corpus()[1][url]


def write_kb(path: Path, entities: list[dict], relations: list[dict]) -> None:
    """Write entity records then relation records, one JSON object per line (sorted keys: byte-stable)."""
    with path.open("w", encoding="utf-8") as f:
        for e in entities:
            f.write(json.dumps(entity_record(e), sort_keys=True, ensure_ascii=False) + "\n")
        for r in relations:
            f.write(json.dumps(relation_record(r), sort_keys=True, ensure_ascii=False) + "\n")
