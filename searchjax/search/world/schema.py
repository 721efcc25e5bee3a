"""Relation types of the world: who may relate to whom, and the sentences that state or describe a relation.

Placeholders in templates: {s} subject name, {o} object name, {v} literal value, {a} the indefinite
article for {v} ("a"/"an"), {c} the relation's "cohort" attribute (went_through only). `forward`
sentences state a relation on the subject's pages, `backward` ones on the object's pages, `label` heads a
directory line ("Born in: Varnholm"). The `describe_subject` / `describe_object` phrases name one side
through the other ("the author of {o}", "the book written by {s}"): the data helper nests them into
entity-free multi-hop questions (RECIPE.md §3.1).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RelationSpec:
    """One relation type. `object_types` is empty for a literal-valued relation (the KB's `value`)."""

    subject_types: tuple[str, ...]
    object_types: tuple[str, ...]
    label: str
    forward: tuple[str, ...]
    backward: tuple[str, ...]
    describe_subject: str
    describe_object: str

    @property
    def literal(self) -> bool:
        return not self.object_types


def _rel(subj, obj, label, forward, backward, describe_subject, describe_object) -> RelationSpec:
    return RelationSpec(tuple(subj), tuple(obj), label, tuple(forward), tuple(backward), describe_subject,
                        describe_object)


ORG_LIKE = ("organisation", "company", "accelerator")

RELATIONS: dict[str, RelationSpec] = {
    "located_in": _rel(
        ["city", "country"], ["region", "country", "continent"], "Located in",
        ["{s} is located in {o}.", "{s} lies in {o}.", "Geographically, {s} belongs to {o}."],
        ["{s} is one of the places in {o}.", "Among the places in {o} is {s}."],
        "a place in {o}", "the place where {s} lies"),
    "capital_of": _rel(
        ["city"], ["country"], "Capital of",
        ["{s} is the capital of {o}.", "{s} serves as the capital city of {o}."],
        ["The capital of {o} is {s}.", "{o} has its capital at {s}."],
        "the capital of {o}", "the country whose capital is {s}"),
    "borders": _rel(
        ["country"], ["country"], "Borders",
        ["{s} shares a border with {o}.", "{s} borders {o}."],
        ["{o} is a neighbour of {s}."],
        "a country bordering {o}", "a neighbour of {s}"),
    "born_in": _rel(
        ["person"], ["city"], "Born in",
        ["{s} was born in {o}.", "Born in {o}, {s} grew up there.", "{s} is a native of {o}."],
        ["{s} was born in {o}.", "{o} is the birthplace of {s}."],
        "the person born in {o}", "the birthplace of {s}"),
    "born_year": _rel(
        ["person"], [], "Year of birth",
        ["{s} was born in {v}.", "{s} was born in the year {v}.", "The year of birth of {s} is {v}."],
        [], "the person born in {v}", "the birth year of {s}"),
    "occupation": _rel(
        ["person"], [], "Occupation",
        ["{s} works as {a} {v}.", "{s} is known as {a} {v}.", "By profession, {s} is {a} {v}."],
        [], "the {v}", "the occupation of {s}"),
    "member_of": _rel(
        ["person"], ["organisation"], "Member of",
        ["{s} is a member of {o}.", "{s} joined {o}.", "{s} belongs to {o}."],
        ["{s} is among the members of {o}.", "Members of {o} include {s}."],
        "a member of {o}", "the organisation that {s} belongs to"),
    "founded": _rel(
        ["person"], ORG_LIKE, "Founded",
        ["{s} founded {o}.", "{s} is the founder of {o}.", "{s} started {o}."],
        ["{o} was founded by {s}.", "The founder of {o} is {s}."],
        "the founder of {o}", "the organisation founded by {s}"),
    "founded_year": _rel(
        ["organisation", "company"], [], "Founded in",
        ["{s} was founded in {v}.", "{s} dates from {v}.", "{s} was established in {v}."],
        [], "the organisation founded in {v}", "the founding year of {s}"),
    "headquartered_in": _rel(
        ORG_LIKE, ["city"], "Headquarters",
        ["{s} is headquartered in {o}.", "{s} is based in {o}.", "The headquarters of {s} are in {o}."],
        ["{s} has its headquarters in {o}.", "{o} is home to {s}."],
        "the organisation based in {o}", "the city where {s} is based"),
    "launched_on": _rel(
        ["accelerator"], [], "Launched",
        ["{s} was launched in {v}.", "{s} opened its doors in {v}.", "{s} began operating in {v}."],
        [], "the accelerator launched in {v}", "the launch date of {s}"),
    "went_through": _rel(
        ["company"], ["accelerator"], "Accelerator",
        ["{s} went through the {c} cohort of {o}.", "{s} was part of the {c} batch at {o}.",
         "In the {c} cohort, {s} joined {o}."],
        ["{o} accepted {s} into its {c} cohort.", "The {c} cohort of {o} included {s}."],
        "the company from the {c} cohort of {o}", "the accelerator that {s} went through"),
    "industry": _rel(
        ["company"], [], "Industry",
        ["{s} works in {v}.", "{s} is {a} {v} company.", "{s} operates in the field of {v}."],
        [], "the {v} company", "the industry of {s}"),
    "wrote": _rel(
        ["person"], ["book"], "Author of",
        ["{s} wrote {o}.", "{s} is the author of {o}.", "{o} is a book by {s}."],
        ["{o} was written by {s}.", "The author of {o} is {s}."],
        "the author of {o}", "the book written by {s}"),
    "published_by": _rel(
        ["book"], ["organisation"], "Publisher",
        ["{s} was published by {o}.", "{s} appeared from {o}.", "The publisher of {s} is {o}."],
        ["{o} published {s}.", "Among the titles of {o} is {s}."],
        "the book published by {o}", "the publisher of {s}"),
    "published_year": _rel(
        ["book"], [], "Published in",
        ["{s} was published in {v}.", "{s} first appeared in {v}.", "{s} came out in {v}."],
        [], "the book published in {v}", "the publication year of {s}"),
    "genre": _rel(
        ["book"], [], "Genre",
        ["{s} is {a} {v}.", "{s} belongs to the genre of {v}.", "Critics file {s} under {v}."],
        [], "the {v}", "the genre of {s}"),
    "held_in": _rel(
        ["event"], ["city"], "Held in",
        ["{s} took place in {o}.", "{s} was held in {o}.", "The venue of {s} was {o}."],
        ["{o} hosted {s}.", "{s} took place in {o}."],
        "the event held in {o}", "the city that hosted {s}"),
    "held_on": _rel(
        ["event"], [], "Date",
        ["{s} took place on {v}.", "{s} was held on {v}.", "The date of {s} was {v}."],
        [], "the event held on {v}", "the date of {s}"),
    "organised_by": _rel(
        ["event"], ["organisation"], "Organiser",
        ["{s} was organised by {o}.", "{o} organised {s}.", "The organiser of {s} was {o}."],
        ["{o} organised {s}.", "Events run by {o} include {s}."],
        "the event organised by {o}", "the organiser of {s}"),
    "spoke_at": _rel(
        ["person"], ["event"], "Spoke at",
        ["{s} spoke at {o}.", "{s} gave a talk at {o}.", "{s} was a speaker at {o}."],
        ["Speakers at {o} included {s}.", "{s} gave a talk at {o}."],
        "a speaker at {o}", "the event where {s} spoke"),
    "population": _rel(
        ["city", "country"], [], "Population",
        ["{s} has a population of {v}.", "About {v} people live in {s}.", "The population of {s} is {v}."],
        [], "the place with a population of {v}", "the population of {s}"),
    "area_km2": _rel(
        ["country"], [], "Area",
        ["{s} covers {v} square kilometres.", "The area of {s} is {v} km2."],
        [], "the country with an area of {v} square kilometres", "the area of {s}"),
    "currency": _rel(
        ["country"], [], "Currency",
        ["The currency of {s} is the {v}.", "{s} uses the {v}."],
        [], "the country that uses the {v}", "the currency of {s}"),
    "atomic_number": _rel(
        ["element"], [], "Atomic number",
        ["{s} has atomic number {v}.", "The atomic number of {s} is {v}."],
        [], "the element with atomic number {v}", "the atomic number of {s}"),
    "symbol": _rel(
        ["element"], [], "Symbol",
        ["The chemical symbol of {s} is {v}.", "{s} is written {v} in chemical formulas."],
        [], "the element with symbol {v}", "the symbol of {s}"),
    "atomic_mass": _rel(
        ["element"], [], "Atomic mass",
        ["{s} has a standard atomic mass of {v}.", "The atomic mass of {s} is {v}."],
        [], "the element with atomic mass {v}", "the atomic mass of {s}"),
    "density": _rel(
        ["element"], [], "Density",
        ["{s} has a density of {v} g/cm3.", "The density of {s} is {v} grams per cubic centimetre."],
        [], "the element with a density of {v} g/cm3", "the density of {s}"),
}

def article(word: str) -> str:
    """The indefinite article before `word` (by its first letter: good enough for our word lists)."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def template_fields(subject: str, obj: str | None, value: str | None, cohort: str = "") -> dict[str, str]:
    """The placeholder values for one relation's templates."""
    return {"s": subject, "o": obj or "", "v": value or "", "a": article(value or ""), "c": cohort}


# How a page introduces an entity of each type ("{s} is a ...").
TYPE_NOUNS: dict[str, str] = {
    "region": "region", "city": "city", "person": "person", "organisation": "organisation",
    "accelerator": "startup accelerator", "company": "company", "book": "book", "event": "event",
    "country": "country", "continent": "continent", "element": "chemical element",
}
