"""Routing replay on the rollout side: an engine built with record_routes reports the experts of every token it
feeds, the driver assembles them per completion across continued turns, and records carry them to the
trainer's arrays (never into JSONL)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax import model as M
from searchjax.data.bucketing import pad_rows
from searchjax.rollout import Request, RolloutDriver, Sampling, SearchJaxEngine
from searchjax.rollout.records import RolloutRecord, read_jsonl, to_arrays, write_jsonl

TEXTS = ["Paris is the capital of", "The river Avon flows through the city of Bath.", "capital of France"]


@pytest.fixture(scope="module")
def routed_engine(cfg, params, tokenizer):
    return SearchJaxEngine(cfg, params, tokenizer, max_concurrent_decodes=4, max_prefill_length=32, max_len=256,
                           sampling=Sampling(1.0), record_routes=True)


def _own_routes(params, cfg, seqs):
    """The training forward's own top-k of every position of each sequence, sorted: [n, L, k] each. One forward
    over the sequences right-padded to the longest (causal, and each token's router sees only its own hidden
    state: padding after a sequence changes none of its routes), so one program compiles, not one per length."""
    rows = pad_rows([(s, np.ones_like(s)) for s in seqs], max(len(s) for s in seqs), pad_id=0)["input_ids"]
    own = np.sort(np.asarray(M.forward(params, jnp.asarray(rows), cfg, return_aux=True)[1]["routes_own"]), axis=-1)
    return [own[i, : len(s)] for i, s in enumerate(seqs)]


def test_completion_routes_cover_every_position_across_continued_turns(routed_engine, params, cfg, tokenizer):
    """Three turns per request, the later ones continuing the slot's cache (prompt chunks of 32): the last
    turn's routes are, position by position, the experts the full forward's router picks."""
    extra = tokenizer.encode(" Search results for the query: Paris is the capital of France.")

    def next_turn(c):
        index, turn = c.request.tag
        if turn == 2:
            return []
        prompt = c.request.prompt + tuple(c.tokens.tolist()) + tuple(extra)
        return [Request(prompt, 6, jax.random.fold_in(c.request.key, turn + 1), c.request.sampling,
                        tag=(index, turn + 1))]

    requests = [Request(tuple(tokenizer.encode(t * 3)), 6, jax.random.key(i), Sampling(1.0), tag=(i, 0))
                for i, t in enumerate(TEXTS)]
    driver = RolloutDriver(routed_engine, params)
    done = {c.request.tag: c for c in driver.run(requests, on_finish=next_turn)}
    assert driver.stats.resumed == 6
    seqs = {tag: list(c.request.prompt) + c.tokens.tolist() for tag, c in done.items()}
    for (tag, c), own in zip(done.items(), _own_routes(params, cfg, list(seqs.values()))):
        assert c.routes.shape == (len(seqs[tag]), cfg.num_hidden_layers, cfg.num_experts_per_tok)
        assert c.routes.dtype == np.int16
        np.testing.assert_array_equal(np.sort(c.routes, axis=-1), own, err_msg=str(tag))


def test_an_engine_without_record_routes_reports_none(engine, params, tokenizer):
    c = RolloutDriver(engine, params).run([Request(tuple(tokenizer.encode(TEXTS[0])), 3, jax.random.key(0))])[0]
    assert c.routes is None
    with pytest.raises(ValueError, match="record_routes=False"):
        engine.prefill_slots_routed(params, engine.init_decode_state(), [])


def _record(n: int, routes=None) -> RolloutRecord:
    return RolloutRecord(prompt_id="p", group_index=0, tokens=list(range(n)), loss_mask=[0] * (n - 1) + [1],
                         logprobs=[0.0] * (n - 1) + [-1.0], prompt_length=n - 1, tool_calls=0, tool_failures=0,
                         response_length=1, answer="", finish_reason="answer", routes=routes)


def test_records_carry_routes_to_the_arrays_but_not_to_jsonl(tmp_path):
    routes = np.arange(5 * 2 * 3, dtype=np.int16).reshape(5, 2, 3)
    records = [_record(5, routes), _record(3)]
    arr = to_arrays(records, pad_id=99)
    assert arr["routes"].shape == (2, 5, 2, 3)
    np.testing.assert_array_equal(arr["routes"][0], routes)
    assert (arr["routes"][1] == -1).all()  # a record without routes: the trainer's own routing
    write_jsonl(records, tmp_path / "r.jsonl")
    assert "routes" not in (tmp_path / "r.jsonl").read_text()
    assert [r.routes for r in read_jsonl(tmp_path / "r.jsonl")] == [None, None]
    assert "routes" not in to_arrays([_record(3)], pad_id=99)
    with pytest.raises(ValueError, match="routes must be"):
        dataclasses.replace(records[0], routes=routes[:4]).check()
