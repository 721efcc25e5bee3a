"""Cost per query: billed token counts × a price table (USD per million tokens) → US cents.

A multi-turn rollout is billed like a chat API that re-sends the whole conversation each turn. With turn k's
request holding P_k context tokens (everything before the k-th run of policy tokens) and O policy tokens in all:

    tokens_in  = Σ_k P_k          tokens_out = O          cached_in = Σ_{k≥2} P_{k−1}

cached_in is the part of each later request that repeats the previous request's prompt, which a provider with
prompt caching bills at its cached-input price (a conservative reading: the previous turn's output and the tool
response are billed as fresh input). Then

    ¢ = 100 · [(tokens_in − cached_in) · p_in + cached_in · p_cached + tokens_out · p_out] / 10⁶

and without caching (the write-up's list-price figures) cached_in = 0.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from searchjax.config import ConfigError, configs_dir, load_yaml
from searchjax.rollout.records import RolloutRecord

DEFAULT_PRICES = configs_dir() / "eval" / "prices.yaml"


@dataclasses.dataclass(frozen=True)
class ModelPrice:
    """USD per million tokens: input, output, and cached input (None when the provider lists none)."""

    input: float
    output: float
    cached_input: float | None = None
    source: str = ""

    def __post_init__(self):
        prices = [self.input, self.output] + ([] if self.cached_input is None else [self.cached_input])
        if any(p < 0 for p in prices):
            raise TypeError(f"ModelPrice: prices must be >= 0, got {self}")


@dataclasses.dataclass(frozen=True)
class PriceTable:
    """A dated price table: `models` maps a model name to its ModelPrice."""

    date: str
    source: str
    models: dict[str, ModelPrice]
    currency: str = "USD"

    def __post_init__(self):
        if self.currency != "USD":
            raise TypeError(f"PriceTable: cents per query need USD prices, got currency {self.currency!r}")
        if not self.models:
            raise TypeError("PriceTable: no models")

    def price(self, name: str) -> ModelPrice:
        if name not in self.models:
            raise ConfigError(f"price table ({self.source}, {self.date}) has no model {name!r}; it lists "
                              f"{sorted(self.models)}")
        return self.models[name]


def load_prices(path: str | Path = DEFAULT_PRICES) -> PriceTable:
    """The price table in `path` (configs/eval/prices.yaml by default); errors name the file and key."""
    return load_yaml(PriceTable, path)


def billed_tokens(record: RolloutRecord) -> tuple[int, int, int]:
    """(tokens_in, cached_in, tokens_out) of a rollout, as the module docstring defines them."""
    mask = record.loss_mask
    starts = [t for t, m in enumerate(mask) if m and (t == 0 or not mask[t - 1])]
    if not starts:  # no turn was generated (the prompt filled the cache): the prompt alone was sent
        return record.prompt_length, 0, 0
    return sum(starts), sum(starts[:-1]), record.response_length


def cents(tokens_in: float, tokens_out: float, price: ModelPrice, cached_in: float = 0.0) -> float:
    """US cents for the given token counts (module docstring); cached_in needs a cached-input price."""
    if cached_in and price.cached_input is None:
        raise ValueError("cents: cached_in > 0 but the price has no cached-input rate")
    if not 0 <= cached_in <= tokens_in:
        raise ValueError(f"cents: need 0 <= cached_in <= tokens_in, got {cached_in} and {tokens_in}")
    usd = (tokens_in - cached_in) * price.input + tokens_out * price.output
    if cached_in:
        usd += cached_in * price.cached_input
    return 100.0 * usd / 1e6
