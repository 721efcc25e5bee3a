"""`build_world`: generate the world for a seed and write DIR/corpus.jsonl, DIR/kb.jsonl and DIR/world.json.

`n_docs` sizes the fictional part so that the corpus has about `n_docs` documents in all; the real-facts part
(every country, capital and element, plus `n_real_cities` cities: about 3,000 documents with the defaults) is
always whole, so a smaller `n_docs` still gets it (then with one fictional entity). The manifest records both
parts' document counts (`num_docs_real`, `num_docs_fictional`).
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from pathlib import Path

from searchjax.atomic import atomic_path, replaceable_dir
from searchjax.search.world.documents import write_documents
from searchjax.search.world.draft import WorldDraft
from searchjax.search.world.fictional import generate_fictional
from searchjax.search.world.kb import CORPUS_FILE, KB_FILE, MANIFEST_FILE, write_kb
from searchjax.search.world.real import generate_real, sources


@dataclasses.dataclass(frozen=True)
class WorldConfig:
    """What a world is made of. The fictional part is sized so the corpus has about `n_docs` documents."""

    seed: int = 0
    n_docs: int = 20_000
    include_real: bool = True
    n_real_cities: int = 500
    docs_per_entity: tuple[int, int] = (2, 4)
    distractor_rate: float = 0.15

    def __post_init__(self):
        if self.n_docs < 1 or self.n_real_cities < 0:
            raise ValueError(f"need n_docs >= 1 and n_real_cities >= 0, got {self.n_docs}, {self.n_real_cities}")
        lo, hi = self.docs_per_entity
        if not 2 <= lo <= hi:
            raise ValueError(f"docs_per_entity must be (lo, hi) with 2 <= lo <= hi, got {self.docs_per_entity}")
        if not 0.0 <= self.distractor_rate <= 1.0:
            raise ValueError(f"distractor_rate must be in [0, 1], got {self.distractor_rate}")


def generate(config: WorldConfig, progress: bool = False) -> tuple[WorldDraft, list[dict]]:
    """The world's entities, relations and documents, in memory (deterministic in config.seed)."""
    draft = WorldDraft(random.Random(config.seed))
    if config.include_real:
        generate_real(draft, config.n_real_cities)
        for e in draft.entities:
            draft.names.reserve(e["type"], e["name"])
    mean_docs = sum(config.docs_per_entity) / 2
    fictional_docs = max(config.n_docs - len(draft.entities) * mean_docs, 0)
    generate_fictional(draft, max(int(fictional_docs / mean_docs), 1), config.distractor_rate)
    return draft, write_documents(draft, config.docs_per_entity, progress)


def build_world(out_dir: str | Path, seed: int = 0, n_docs: int = 20_000, include_real: bool = True,
                n_real_cities: int = 500, docs_per_entity: tuple[int, int] = (2, 4),
                distractor_rate: float = 0.15, progress: bool = True) -> dict:
    """Generate the world and write it to `out_dir`; returns the manifest (also DIR/world.json).

    The world is written into a temporary sibling and renamed at the end, so a failure leaves `out_dir` as it
    was. An existing `out_dir` is replaced whole, but only when it holds a world (a world.json).
    """
    config = WorldConfig(seed, n_docs, include_real, n_real_cities, tuple(docs_per_entity), distractor_rate)
    out_dir = Path(out_dir)
    if not replaceable_dir(out_dir, MANIFEST_FILE):
        raise FileExistsError(f"{out_dir} exists and is not a searchjax world (no {MANIFEST_FILE}); "
                              "refusing to overwrite it")
    draft, corpus = generate(config, progress)
    real = {e["id"] for e in draft.entities if e["part"] == "real"}
    n_real_docs = sum(row["about"] in real for row in corpus)
    manifest = {
        "config": dataclasses.asdict(config),
        "num_docs": len(corpus),
        "num_docs_real": n_real_docs,
        "num_docs_fictional": len(corpus) - n_real_docs,
        "num_entities": len(draft.entities),
        "num_relations": len(draft.relations),
        "entity_types": dict(sorted(Counter(e["type"] for e in draft.entities).items())),
        "sources": sources() if include_real else [],
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        with (tmp / CORPUS_FILE).open("w", encoding="utf-8") as f:
            for row in corpus:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        write_kb(tmp / KB_FILE, draft.entities, draft.relations)
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest
