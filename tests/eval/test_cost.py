"""Cost arithmetic, billed tokens of a multi-turn record, and the shipped price table."""

import pytest

from searchjax.config import ConfigError
from searchjax.eval.cost import DEFAULT_PRICES, ModelPrice, billed_tokens, cents, load_prices
from searchjax.rollout.records import RolloutRecord


def _record(mask, prompt_length):
    n = len(mask)
    return RolloutRecord(prompt_id="q", group_index=0, tokens=[1] * n, loss_mask=mask, logprobs=[0.0] * n,
                         prompt_length=prompt_length, tool_calls=1, tool_failures=0, response_length=sum(mask),
                         answer="", finish_reason="answer")


def test_cents_by_hand():
    price = ModelPrice(input=0.5, output=2.0, cached_input=0.05)
    # 10,000 input and 1,000 output tokens: 10,000 * 0.5 / 1e6 + 1,000 * 2 / 1e6 = $0.007 = 0.7 cents
    assert cents(10_000, 1_000, price) == pytest.approx(0.7)
    # 6,000 of the input cached: 4,000 * 0.5 + 6,000 * 0.05 + 1,000 * 2 = 4,300 / 1e6 dollars = 0.43 cents
    assert cents(10_000, 1_000, price, cached_in=6_000) == pytest.approx(0.43)
    with pytest.raises(ValueError, match="no cached-input rate"):
        cents(10, 1, ModelPrice(1.0, 1.0), cached_in=5)
    with pytest.raises(ValueError, match="cached_in <= tokens_in"):
        cents(10, 1, price, cached_in=11)


def test_billed_tokens_of_a_three_turn_rollout():
    # prompt 5 | turn 1: 3 policy tokens | tool response 4 | turn 2: 2 | tool response 3 | turn 3: 1
    mask = [0] * 5 + [1] * 3 + [0] * 4 + [1] * 2 + [0] * 3 + [1]
    tokens_in, cached_in, tokens_out = billed_tokens(_record(mask, 5))
    # requests hold 5, 12 and 17 context tokens; later requests repeat the previous prompt (5, then 12)
    assert (tokens_in, cached_in, tokens_out) == (5 + 12 + 17, 5 + 12, 6)
    assert billed_tokens(_record([0] * 7, 7)) == (7, 0, 0)  # the prompt filled the cache: nothing generated


def test_the_shipped_table_has_a_date_a_source_and_prices():
    table = load_prices(DEFAULT_PRICES)
    assert table.date == "2026-12-01" and table.source and table.currency == "USD"
    for name, price in table.models.items():
        assert price.input > 0 and price.output > price.input and price.source.startswith("https://"), name
    with pytest.raises(ConfigError, match="no model 'gpt-x'.*qwen3.5-plus"):
        table.price("gpt-x")


def test_a_bad_price_table_names_the_file(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("date: x\nsource: y\nmodels:\n  m: {input: 1, output: 1, cache: 2}\n")
    with pytest.raises(ConfigError, match="p.yaml.*unknown key.*cache"):
        load_prices(bad)
    bad.write_text("date: x\nsource: y\ncurrency: EUR\nmodels:\n  m: {input: 1, output: 1}\n")
    with pytest.raises(ConfigError, match="p.yaml.*USD"):
        load_prices(bad)
