"""The procedurally generated fictional part of the world.

Entity types and their relations (subject --relation--> object):
  city --located_in--> region;  person --born_in--> city, born_year, occupation;
  person --founded--> organisation | company | accelerator;  organisation/company --founded_year;
  organisation | company | accelerator --headquartered_in--> city;  accelerator --launched_on ("March 2005");
  company --went_through--> accelerator (attrs.cohort "summer 2007"), industry;
  person --wrote--> book;  book --published_by--> organisation (a publisher), published_year, genre;
  event --held_in--> city, held_on ("14 June 1998"), --organised_by--> organisation;
  person --member_of--> organisation;  person --spoke_at--> event.
Dates are consistent (founders are adults, cohorts follow launches and foundings). A share of entities
(`distractor_rate`) are look-alikes of an earlier entity of the same type: a similar name (see
names.NameMaker.similar) and, with probability 1/2 each, the same place-like facts; each look-alike lists
its original in attrs["similar_to"].
"""

from __future__ import annotations

from searchjax.search.world.draft import WorldDraft

# Shares of the fictional entities per type (sum 1).
TYPE_SHARES = {"region": 0.01, "city": 0.06, "person": 0.38, "organisation": 0.08, "publisher": 0.02,
               "accelerator": 0.02, "company": 0.1, "book": 0.2, "event": 0.13}
OCCUPATIONS = ("novelist", "engineer", "historian", "painter", "chemist", "entrepreneur", "architect",
               "composer", "journalist", "botanist", "economist", "physician", "poet", "cartographer")
GENRES = ("novel", "short story collection", "memoir", "biography", "poetry collection", "travelogue",
          "history", "cookbook", "science fiction novel", "detective novel")
INDUSTRIES = ("logistics", "robotics", "agriculture", "payments", "healthcare", "education", "energy",
              "gaming", "biotechnology", "security", "textiles", "shipping")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
# Place-like facts a look-alike may share with its original (never dates: those must stay consistent).
SHAREABLE = {"born_in", "occupation", "headquartered_in", "industry", "genre", "published_by", "held_in",
             "located_in", "organised_by"}
LATEST_YEAR = 2024


def type_counts(n_entities: int) -> dict[str, int]:
    """Entities per type for about `n_entities` fictional entities (at least 2 of each type)."""
    return {t: max(2, round(share * n_entities)) for t, share in TYPE_SHARES.items()}


def _named(draft: WorldDraft, etype: str, rate: float) -> tuple[dict, dict | None]:
    """A new entity of `etype` (publishers are organisations); a look-alike of an earlier one w.p. `rate`."""
    kind = "organisation" if etype == "publisher" else etype
    pool = draft.families[etype]
    like = draft.rng.choice(pool) if pool and draft.rng.random() < rate else None
    name = draft.names.similar(etype, like["name"]) if like else draft.names.new(etype)
    entity = draft.add_entity(kind, name, attrs={"publisher": True} if etype == "publisher" else None)
    if like is not None:
        entity["attrs"]["similar_to"] = [like["id"]]
    pool.append(entity)
    return entity, like


def _shared_or(draft: WorldDraft, like: dict | None, relation: str, fresh):
    """The object/value `like` has for `relation` (w.p. 1/2, shareable relations only), else fresh()."""
    if like is not None and relation in SHAREABLE and draft.rng.random() < 0.5:
        for r in draft.relations_of(like["id"], relation):
            return draft.by_id[r["object"]] if r["object"] else r["value"]
    return fresh()


def _adult_person(draft: WorldDraft, latest_year: int) -> dict:
    """A person born at least 20 years before `latest_year` (the earliest-born one when none is)."""
    for _ in range(20):
        p = draft.pick("person")
        if p["attrs"]["born_year"] <= latest_year - 20:
            return p
    return min(draft.families["person"], key=lambda p: p["attrs"]["born_year"])


def _places_and_people(draft: WorldDraft, counts: dict[str, int], rate: float) -> None:
    rng = draft.rng
    for _ in range(counts["region"]):
        _named(draft, "region", 0.0)
    for _ in range(counts["city"]):
        city, like = _named(draft, "city", rate)
        draft.relate(city, "located_in", _shared_or(draft, like, "located_in", lambda: draft.pick("region")))
        draft.relate(city, "population", value=f"{rng.randrange(2_000, 2_000_000):,}")
    for _ in range(counts["person"]):
        person, like = _named(draft, "person", rate)
        draft.relate(person, "born_in", _shared_or(draft, like, "born_in", lambda: draft.pick("city")))
        draft.relate(person, "born_year", value=rng.randint(1900, 1995))
        draft.relate(person, "occupation", value=_shared_or(draft, like, "occupation",
                                                            lambda: rng.choice(OCCUPATIONS)))


def _founded(draft: WorldDraft, entity: dict, like: dict | None, earliest: int) -> int:
    """Give `entity` a founder, a headquarters and (returned) a founding year >= `earliest`."""
    rng = draft.rng
    founder = _adult_person(draft, LATEST_YEAR - 5)
    year = min(LATEST_YEAR - 3, max(earliest, founder["attrs"]["born_year"] + rng.randint(22, 50)))
    draft.relate(founder, "founded", entity)
    draft.relate(entity, "headquartered_in", _shared_or(draft, like, "headquartered_in",
                                                         lambda: draft.pick("city")))
    return year


def _organisations(draft: WorldDraft, counts: dict[str, int], rate: float) -> None:
    rng = draft.rng
    for etype in ("publisher", "organisation"):
        for _ in range(counts[etype]):
            org, like = _named(draft, etype, rate)
            draft.relate(org, "founded_year", value=_founded(draft, org, like, 1850))
    for _ in range(counts["accelerator"]):
        acc, like = _named(draft, "accelerator", rate)
        year = _founded(draft, acc, like, 1990)
        draft.relate(acc, "launched_on", value=f"{rng.choice(MONTHS)} {year}")
        acc["attrs"]["launch_year"] = year
    for _ in range(counts["company"]):
        company, like = _named(draft, "company", rate)
        year = _founded(draft, company, like, 1950)
        draft.relate(company, "founded_year", value=year)
        draft.relate(company, "industry", value=_shared_or(draft, like, "industry", lambda: rng.choice(INDUSTRIES)))
        if rng.random() < 0.5:
            acc = draft.pick("accelerator")
            cohort_year = min(LATEST_YEAR, max(year, acc["attrs"]["launch_year"]) + rng.randint(0, 2))
            draft.relate(company, "went_through", acc, cohort=f"{rng.choice(('summer', 'winter'))} {cohort_year}")


def _works_and_events(draft: WorldDraft, counts: dict[str, int], rate: float) -> None:
    rng = draft.rng
    publishers = draft.families["publisher"]
    societies = draft.families["organisation"]
    for _ in range(counts["book"]):
        book, like = _named(draft, "book", rate)
        author = _adult_person(draft, LATEST_YEAR)
        draft.relate(author, "wrote", book)
        draft.relate(book, "published_by", _shared_or(draft, like, "published_by", lambda: rng.choice(publishers)))
        year = min(LATEST_YEAR, author["attrs"]["born_year"] + rng.randint(20, 70))
        draft.relate(book, "published_year", value=year)
        draft.relate(book, "genre", value=_shared_or(draft, like, "genre", lambda: rng.choice(GENRES)))
    for _ in range(counts["event"]):
        event, like = _named(draft, "event", rate)
        year = rng.randint(1950, LATEST_YEAR)
        draft.relate(event, "held_in", _shared_or(draft, like, "held_in", lambda: draft.pick("city")))
        draft.relate(event, "held_on", value=f"{rng.randint(1, 28)} {rng.choice(MONTHS)} {year}")
        draft.relate(event, "organised_by", _shared_or(draft, like, "organised_by", lambda: rng.choice(societies)))
        speakers = {_adult_person(draft, year)["id"] for _ in range(rng.randint(1, 3))}
        for pid in sorted(speakers):
            draft.relate(draft.by_id[pid], "spoke_at", event)
    for person in draft.families["person"]:
        for oid in sorted({rng.choice(societies)["id"] for _ in range(rng.randint(0, 2))}):
            draft.relate(person, "member_of", draft.by_id[oid])


def generate_fictional(draft: WorldDraft, n_entities: int, distractor_rate: float = 0.15) -> None:
    """Add about `n_entities` fictional entities and their relations to `draft` (deterministic in its rng)."""
    if not 0.0 <= distractor_rate <= 1.0:
        raise ValueError(f"distractor_rate must be in [0, 1], got {distractor_rate}")
    counts = type_counts(n_entities)
    _places_and_people(draft, counts, distractor_rate)
    _organisations(draft, counts, distractor_rate)
    _works_and_events(draft, counts, distractor_rate)
