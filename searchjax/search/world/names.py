"""Fictional names from syllables and word lists, unique per entity type, with deliberate near-duplicates.

Names are built from invented syllables so that no fact about them can come from a model's memory.
`NameMaker.similar` derives a distractor name from an existing one (same surname, same stem with another
suffix, same title noun with another adjective), so that a search for one entity also surfaces look-alikes.
"""

from __future__ import annotations

import random

_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s", "st", "t",
           "th", "v", "vr", "z", "sh", "c", "j", "w")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ia", "ou", "ei", "y")
_CODAS = ("", "", "n", "r", "l", "s", "th", "m", "nd", "rk", "x", "v")
_CITY_SUFFIX = ("holm", "ford", "vik", "burg", "mere", "stad", "port", "dale", "wick", "haven", "grad")
_REGION_SUFFIX = ("ia", "land", "mark", "ovia", "eth", "istan", "ora")
_COMPANY_SUFFIX = ("Labs", "Systems", "Robotics", "Analytics", "Works", "Dynamics", "Bio", "Energy",
                   "Networks", "Foods", "Logistics", "Security")
_ORG_KINDS = ("Society", "Institute", "Guild", "Foundation", "Academy", "Circle", "Union", "Council")
_PUBLISHER_KINDS = ("Press", "House", "Books", "Publishing")
_ACCEL_KINDS = ("Launchpad", "Forge", "Accelerator", "Foundry", "Catalyst", "Ignite")
_EVENT_KINDS = ("Festival", "Summit", "Conference", "Fair", "Symposium", "Expo", "Games", "Congress")
_ADJECTIVES = ("Glass", "Silent", "Hidden", "Copper", "Winter", "Broken", "Golden", "Distant", "Hollow",
               "Crimson", "Salt", "Paper", "Iron", "Pale", "Northern", "Last", "Quiet", "Burning", "Velvet")
_NOUNS = ("Orchard", "Harbour", "Lantern", "River", "Archive", "Garden", "Tide", "Engine", "Bridge",
          "Compass", "Atlas", "Mirror", "Tower", "Season", "Letter", "Map", "Voyage", "Clock", "Meadow")
_TOPICS = ("Cartographers", "Astronomers", "Engineers", "Poets", "Botanists", "Historians", "Chemists",
           "Architects", "Sailors", "Weavers", "Mathematicians", "Linguists")


class NameMaker:
    """Draws names with `rng`; every name handed out is unique within its type."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: dict[str, set[str]] = {}

    def stem(self, syllables: int | None = None) -> str:
        n = syllables or self.rng.choice((2, 2, 3))
        parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(n)]
        return ("".join(parts) + self.rng.choice(_CODAS)).capitalize()

    def _draw(self, kind: str) -> str:
        rng, s = self.rng, self.stem
        if kind == "person":
            return f"{s(2)} {s()}"
        if kind == "city":
            return rng.choice((f"{s(2)}{rng.choice(_CITY_SUFFIX)}", f"Port {s(2)}", f"{s()}"))
        if kind == "region":
            return f"{s(2)}{rng.choice(_REGION_SUFFIX)}"
        if kind == "company":
            return f"{s()} {rng.choice(_COMPANY_SUFFIX)}"
        if kind == "organisation":
            return rng.choice((f"{s()} {rng.choice(_ORG_KINDS)}",
                               f"{rng.choice(_ORG_KINDS)} of {s()} {rng.choice(_TOPICS)}"))
        if kind == "publisher":
            return f"{s()} {rng.choice(_PUBLISHER_KINDS)}"
        if kind == "accelerator":
            return f"{s()} {rng.choice(_ACCEL_KINDS)}"
        if kind == "event":
            return f"{s()} {rng.choice(_ADJECTIVES)} {rng.choice(_EVENT_KINDS)}"
        if kind == "book":
            return rng.choice((f"The {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}",
                               f"{rng.choice(_NOUNS)} of {s()}", f"A {rng.choice(_NOUNS)} for {s(2)}"))
        raise ValueError(f"no name pattern for entity type {kind!r}")

    def _claim(self, kind: str, name: str) -> bool:
        used = self.used.setdefault(kind, set())
        if name in used:
            return False
        used.add(name)
        return True

    def reserve(self, kind: str, name: str) -> None:
        """Mark `name` as taken for `kind` (e.g. real place names, so fictional ones never collide)."""
        self._claim(kind, name)

    def new(self, kind: str) -> str:
        """A fresh name of type `kind` never handed out before."""
        for _ in range(1000):
            name = self._draw(kind)
            if self._claim(kind, name):
                return name
        raise RuntimeError(f"could not find a fresh {kind} name after 1000 draws; the world is too large")

    def similar(self, kind: str, name: str) -> str:
        """A fresh name that looks like `name` (falls back to a new name when none is free).

        People keep their surname and get another first name; pooled names keep their invented stem and
        change the pooled word (Vellora Labs -> Vellora Systems); places get a qualifier (North Varnholm).
        """
        words = name.split()
        pooled = [i for i, w in enumerate(words) if w in _POOLED]
        for _ in range(50):
            if kind == "person":
                candidate = " ".join([self.stem(2)] + words[1:])
            elif pooled:
                i = self.rng.choice(pooled)
                candidate = " ".join(words[:i] + [self.rng.choice(_POOL_OF[words[i]])] + words[i + 1 :])
            else:
                candidate = self.rng.choice(_QUALIFIERS).format(name)
            if self._claim(kind, candidate):
                return candidate
        return self.new(kind)


_QUALIFIERS = ("North {}", "New {}", "{} Falls", "Upper {}", "{} Minor", "Old {}")
_POOLS = (_COMPANY_SUFFIX, _ORG_KINDS, _TOPICS, _PUBLISHER_KINDS, _ACCEL_KINDS, _EVENT_KINDS, _ADJECTIVES,
          _NOUNS)
_POOL_OF = {w: pool for pool in _POOLS for w in pool}
_POOLED = frozenset(_POOL_OF)
