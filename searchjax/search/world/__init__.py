"""The offline world: a generated fictional world plus real facts from PyPI packages, as a corpus and a KB.

`build_world(DIR, seed, n_docs=...)` (CLI: `searchjax world build --out DIR --seed S --docs N`) writes:

DIR/corpus.jsonl — one document per line, the input of `build_index`:
    {"id": "doc:0004333", "about": "book:000003", "title": str, "url": str, "text": str}
  `about` is the entity the page is about; urls are unique; ids are "doc:" + a 7-digit running number.

DIR/kb.jsonl — entity records first, then relation records, one JSON object per line (sorted keys):
    {"kind": "entity", "id": "person:000123", "type": "person", "name": "Ludev Zaereitan",
     "aliases": [str], "attrs": {...}, "part": "fictional" | "real", "doc_ids": [doc ids about it]}
    {"kind": "relation", "subject": entity id, "relation": name, "object": entity id | null,
     "value": str | null, "attrs": {...}, "doc_ids": [ids of every document whose text states it]}
  Exactly one of `object` / `value` is set (value: a literal such as "1983", "March 2005", "77,006").
  Entity ids are "type:key": fictional keys are 6-digit running numbers per type; real ones are the ISO
  country code ("country:FR"), continent code ("continent:EU"), "geo" + GeoNames id ("city:geo2988507") or
  element symbol ("element:Fe"). Types: region, city, person, organisation (attrs.publisher marks
  publishers), accelerator, company, book, event (fictional); continent, country, city, element (real).
  Literal relations are mirrored into the subject's attrs (attrs["born_year"] == 1983); look-alike
  distractors carry attrs["similar_to"] = [ids of the entity they imitate]. Relation types, their allowed
  subject/object types and their wordings: schema.RELATIONS; went_through carries attrs["cohort"]
  ("summer 2007").

DIR/world.json — the config (seed, sizes), counts per type, and the source packages with licences.

The same seed and options give byte-identical files. `KnowledgeBase.load(DIR)` reads kb.jsonl back with
lookups: `entity(id)`, `by_type`, `by_name`, `relations_from(id, relation=None)`,
`relations_to(id, relation=None)`, `confirmed(min_docs=2)`, `statement(rel)`, `describe_subject(rel)`,
`describe_object(rel)`, `document(doc_id)`, `doc_id_for_url(url)`.
"""

from searchjax.search.world.build import WorldConfig, build_world, generate
from searchjax.search.world.kb import CORPUS_FILE, KB_FILE, MANIFEST_FILE, Entity, KnowledgeBase, Relation
from searchjax.search.world.schema import RELATIONS, RelationSpec

__all__ = [
    "CORPUS_FILE",
    "KB_FILE",
    "MANIFEST_FILE",
    "RELATIONS",
    "Entity",
    "KnowledgeBase",
    "Relation",
    "RelationSpec",
    "WorldConfig",
    "build_world",
    "generate",
]
