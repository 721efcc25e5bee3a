"""A world under construction: entities and relations as plain dicts, before documents are written."""

from __future__ import annotations

import random
from collections import defaultdict

from searchjax.search.world.names import NameMaker
from searchjax.search.world.schema import RELATIONS


class WorldDraft:
    """Holds entities (`id, type, name, aliases, attrs, part, doc_ids`) and relations
    (`subject, relation, object, value, attrs, doc_ids`) while the generators add to them."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.names = NameMaker(rng)
        self.entities: list[dict] = []
        self.relations: list[dict] = []
        self.by_id: dict[str, dict] = {}
        self.by_type: dict[str, list[dict]] = defaultdict(list)
        self.families: dict[str, list[dict]] = defaultdict(list)  # by name family (publisher apart)
        self._counts: dict[str, int] = defaultdict(int)
        self._from: dict[str, list[dict]] = defaultdict(list)

    def add_entity(self, etype: str, name: str, part: str = "fictional", key: str | None = None,
                   aliases: tuple[str, ...] = (), attrs: dict | None = None) -> dict:
        """Add an entity; its id is "type:key" (fictional entities get a running number as key)."""
        if key is None:
            key = f"{self._counts[etype]:06d}"
        self._counts[etype] += 1
        entity = {"id": f"{etype}:{key}", "type": etype, "name": name, "aliases": list(aliases),
                  "attrs": dict(attrs or {}), "part": part, "doc_ids": []}
        if entity["id"] in self.by_id:
            raise ValueError(f"duplicate entity id {entity['id']!r}")
        self.entities.append(entity)
        self.by_id[entity["id"]] = entity
        self.by_type[etype].append(entity)
        return entity

    def relate(self, subject: dict, relation: str, obj: dict | None = None, value=None, **attrs) -> dict:
        """Add `subject --relation--> obj` (an entity) or a literal `value`; literals are mirrored into the
        subject's attrs. Types are checked against the schema."""
        spec = RELATIONS[relation]
        if subject["type"] not in spec.subject_types:
            raise ValueError(f"{relation}: subject type {subject['type']!r} not in {spec.subject_types}")
        if spec.literal != (obj is None):
            raise ValueError(f"{relation}: {'a literal value' if spec.literal else 'an object entity'} expected")
        if obj is not None and obj["type"] not in spec.object_types:
            raise ValueError(f"{relation}: object type {obj['type']!r} not in {spec.object_types}")
        if obj is None:
            subject["attrs"][relation] = value
        rel = {"subject": subject["id"], "relation": relation, "object": obj["id"] if obj else None,
               "value": None if value is None else str(value), "attrs": attrs, "doc_ids": []}
        self.relations.append(rel)
        self._from[subject["id"]].append(rel)
        return rel

    def relations_of(self, entity_id: str, relation: str) -> list[dict]:
        return [r for r in self._from[entity_id] if r["relation"] == relation]

    def pick(self, family: str) -> dict:
        """A random generated entity of a name family ("city", "publisher", ...; real entities excluded)."""
        return self.rng.choice(self.families[family])
