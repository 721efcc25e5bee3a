"""Documents about each entity, in several styles and wordings; every relation a text states is recorded.

Styles (the first two always, then news/blog pages up to the entity's document count):
- encyclopedia (wikiverse.example): a lead sentence, every relation of the entity as subject, and up to
  MAX_BACKWARD relations where it is the object;
- registry (registry.example): "Label: value" lines for every relation as subject;
- news (dailyledger.example) and blog (notes.example): a random subset of the relations, random wordings.
So each relation is stated by at least two documents of its subject, plus some of its object's pages.
"""

from __future__ import annotations

import random
import re

from tqdm import tqdm

from searchjax.search.world.draft import WorldDraft
from searchjax.search.world.schema import RELATIONS, TYPE_NOUNS, article, template_fields

MAX_BACKWARD = 8
_HEADLINES = ("What we know about {n}", "{n} in the spotlight", "A closer look at {n}", "Five facts about {n}")
_BLOG_OPENERS = ("I have been reading about {n}.", "A few notes on {n}, for the record.",
                 "Someone asked me about {n} last week.")
_BLOG_CLOSERS = ("More another time.", "Corrections welcome.", "That is all I have for now.")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


class _Facts:
    """The relations around one entity and how to phrase them."""

    def __init__(self, draft: WorldDraft, forward: list[dict], backward: list[dict]):
        self.draft, self.forward, self.backward = draft, forward, backward

    def fill(self, rel: dict) -> dict[str, str]:
        by_id = self.draft.by_id
        obj = by_id[rel["object"]]["name"] if rel["object"] else None
        return template_fields(by_id[rel["subject"]]["name"], obj, rel["value"], rel["attrs"].get("cohort", ""))

    def sentence(self, rel: dict, rng: random.Random, backward: bool) -> str:
        spec = RELATIONS[rel["relation"]]
        templates = spec.backward if backward and spec.backward else spec.forward
        return rng.choice(templates).format(**self.fill(rel))

    def line(self, rel: dict) -> str:
        f = self.fill(rel)
        target = f["o"] or f["v"]
        return f"{RELATIONS[rel['relation']].label}: {target}" + (f" ({f['c']})" if f["c"] else "")


def _encyclopedia(e: dict, facts: _Facts, rng: random.Random) -> tuple[str, str, str, list[dict]]:
    back = facts.backward if len(facts.backward) <= MAX_BACKWARD else rng.sample(facts.backward, MAX_BACKWARD)
    noun = TYPE_NOUNS[e["type"]]
    parts = [f"{e['name']} is {article(noun)} {noun}."]
    parts += [facts.sentence(r, rng, False) for r in facts.forward]
    parts += [facts.sentence(r, rng, True) for r in back]
    url = f"https://wikiverse.example/wiki/{slug(e['name'])}_({e['type']})"
    return e["name"], url, " ".join(parts), facts.forward + back


def _registry(e: dict, facts: _Facts, rng: random.Random) -> tuple[str, str, str, list[dict]]:
    lines = [f"Registry entry for {e['name']} ({TYPE_NOUNS[e['type']]})."] + [facts.line(r) for r in facts.forward]
    url = f"https://registry.example/{e['type']}/{slug(e['id'].split(':', 1)[1])}"
    return f"{e['name']} | {TYPE_NOUNS[e['type']]} record", url, "\n".join(lines), list(facts.forward)


def _subset(facts: _Facts, rng: random.Random) -> list[tuple[dict, bool]]:
    pool = [(r, False) for r in facts.forward] + [(r, True) for r in facts.backward[: 2 * MAX_BACKWARD]]
    return rng.sample(pool, min(len(pool), rng.randint(2, 4)))


def _news(e: dict, facts: _Facts, rng: random.Random, k: int) -> tuple[str, str, str, list[dict]]:
    chosen = _subset(facts, rng)
    text = " ".join([f"Our reporters looked into {e['name']}."] + [facts.sentence(r, rng, b) for r, b in chosen])
    url = f"https://dailyledger.example/{e['type']}/{slug(e['name'])}-{k}"
    return rng.choice(_HEADLINES).format(n=e["name"]), url, text, [r for r, _ in chosen]


def _blog(e: dict, facts: _Facts, rng: random.Random, k: int) -> tuple[str, str, str, list[dict]]:
    chosen = _subset(facts, rng)
    parts = [rng.choice(_BLOG_OPENERS).format(n=e["name"])] + [facts.sentence(r, rng, b) for r, b in chosen]
    url = f"https://notes.example/posts/{e['type']}/{slug(e['name'])}-{k}"
    return f"Notes on {e['name']}", url, " ".join(parts + [rng.choice(_BLOG_CLOSERS)]), [r for r, _ in chosen]


def write_documents(draft: WorldDraft, docs_per_entity: tuple[int, int], progress: bool = False) -> list[dict]:
    """Render every entity's documents; fills entity["doc_ids"] and relation["doc_ids"]; returns the corpus
    rows {id, about, title, url, text} in entity order."""
    forward: dict[str, list[dict]] = {e["id"]: [] for e in draft.entities}
    backward: dict[str, list[dict]] = {e["id"]: [] for e in draft.entities}
    for r in draft.relations:
        forward[r["subject"]].append(r)
        if r["object"]:
            backward[r["object"]].append(r)
    rng, corpus = draft.rng, []
    lo, hi = docs_per_entity
    if not 2 <= lo <= hi:
        raise ValueError(f"docs_per_entity must be (lo, hi) with 2 <= lo <= hi, got {docs_per_entity}")
    for e in tqdm(draft.entities, desc="world documents", unit="entity", disable=not progress):
        facts = _Facts(draft, forward[e["id"]], backward[e["id"]])
        pages = [_encyclopedia(e, facts, rng), _registry(e, facts, rng)]
        for k in range(max(0, rng.randint(lo, hi) - 2)):
            pages.append(_news(e, facts, rng, k) if rng.random() < 0.5 else _blog(e, facts, rng, k))
        for title, url, text, stated in pages:
            doc_id = f"doc:{len(corpus):07d}"
            corpus.append({"id": doc_id, "about": e["id"], "title": title, "url": url, "text": text})
            e["doc_ids"].append(doc_id)
            for r in stated:
                if doc_id not in r["doc_ids"][-1:]:
                    r["doc_ids"].append(doc_id)
    return corpus

