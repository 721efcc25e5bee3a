"""The engine and the rollout driver on the tiny preset: μ_infer, continuous batching, stops, params swap, and
multi-turn cache extension."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax import model as M
from searchjax.rollout import Request, RolloutDriver, Sampling, SearchJaxEngine, sampling_logprobs
from searchjax.rollout.engine import SlotPrefill
from searchjax.rollout.sampling import SamplingArrays
from searchjax.sharding import make_mesh

PROMPTS = [
    "Paris is the capital of",
    "The river Avon flows through the city of Bath. Search the web for the answer, then answer briefly.",
    "Search results for the query:",
    "capital of France",
    "The river",
    "Answer briefly with the name of the city.",
]


@pytest.fixture(scope="module")
def driver(engine, params):
    return RolloutDriver(engine, params)


def _requests(tokenizer, sampling, max_new=(7, 12, 5, 9, 3, 10), seed=0, **kw):
    key = jax.random.key(seed)
    return [
        Request(tuple(tokenizer.encode(p)), n, jax.random.fold_in(key, i), sampling, tag=i, **kw)
        for i, (p, n) in enumerate(zip(PROMPTS, max_new))
    ]


WIDTH = 64  # every recomputation runs forward on [len(PROMPTS), WIDTH]: one compilation for the module


def _by_tag(completions):
    return {c.request.tag: c for c in completions}


def _forward_logits(params, cfg, sequences):
    """Training-forward logits of right-padded sequences (causal: padding changes no earlier position)."""
    batch = np.zeros((len(PROMPTS), WIDTH), np.int32)
    for i, seq in enumerate(sequences):
        batch[i, : len(seq)] = seq
    return M.forward(params, jnp.asarray(batch), cfg)


_logprobs_jit = jax.jit(sampling_logprobs)


@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.7, 0.9, 40)], ids=["plain", "truncated"])
def test_recorded_logprobs_equal_forward_recomputation(driver, params, cfg, tokenizer, sampling):
    done = sorted(driver.run(_requests(tokenizer, sampling)), key=lambda c: c.request.tag)
    assert len(done) == len(PROMPTS)
    logits = np.asarray(_forward_logits(params, cfg, [list(c.request.prompt) + c.tokens.tolist() for c in done]))
    # The logits that predicted each generated token, all rows in one [len(PROMPTS) * 12, V] batch.
    rows = np.zeros((len(PROMPTS) * 12, cfg.vocab_size), np.float32)
    index, k = [], 0
    for c in done:
        n, m = len(c.request.prompt), len(c.tokens)
        rows[k : k + m] = logits[c.request.tag, n - 1 : n - 1 + m]
        index.append((k, m))
        k += m
    logp = np.asarray(_logprobs_jit(jnp.asarray(rows), SamplingArrays.of([sampling] * len(rows))))
    for c, (k, m) in zip(done, index):
        assert c.finish_reason == "max_tokens" and len(c.tokens) == c.request.max_new_tokens
        assert np.isfinite(c.logprobs).all()
        np.testing.assert_allclose(c.logprobs, logp[np.arange(k, k + m), c.tokens], atol=1e-4, rtol=0)


def test_greedy_continuous_batching_equals_single_requests(driver, params, cfg, tokenizer):
    requests = _requests(tokenizer, Sampling(0.0))
    batched = _by_tag(driver.run(requests))  # 6 requests over 4 slots: slots are reused
    for r in requests:
        alone = driver.run([r])[0]
        np.testing.assert_array_equal(batched[r.tag].tokens, alone.tokens)
        np.testing.assert_array_equal(alone.logprobs, 0.0)  # greedy: μ is a point mass
    # And both equal argmax decoding with the training forward pass.
    seqs = [list(r.prompt) for r in requests]
    for _ in range(max(r.max_new_tokens for r in requests)):
        logits = np.asarray(_forward_logits(params, cfg, seqs))
        seqs = [s + [int(np.argmax(logits[i, len(s) - 1]))] for i, s in enumerate(seqs)]
    for r, s in zip(requests, seqs):
        np.testing.assert_array_equal(batched[r.tag].tokens, s[len(r.prompt) : len(r.prompt) + r.max_new_tokens])


def test_sampled_tokens_depend_only_on_the_request_key(driver, tokenizer):
    requests = _requests(tokenizer, Sampling(1.0), seed=3)
    batched = _by_tag(driver.run(requests))
    alone = driver.run([requests[4]])[0]
    np.testing.assert_array_equal(batched[4].tokens, alone.tokens)
    np.testing.assert_allclose(batched[4].logprobs, alone.logprobs, atol=1e-6)
    other = driver.run(_requests(tokenizer, Sampling(1.0), seed=4)[4:5])[0]
    assert other.tokens.tolist() != alone.tokens.tolist()


def test_stop_token_in_the_middle_is_exact(engine, params, tokenizer, scripted):
    s = tokenizer.special
    prompt = tuple(tokenizer.encode("capital of France is Paris"))
    a, b, c, d = prompt[-1], tokenizer.encode(" river")[0], tokenizer.encode(" city")[0], 100
    assert len({a, b, c, d, s.tool_call_end}) == 5
    chain = {a: b, b: c, c: s.tool_call_end, s.tool_call_end: d, d: a}
    drv = RolloutDriver(engine, scripted(params, chain))
    free = drv.run([Request(prompt, 8, jax.random.key(0), Sampling(1.0))])[0]
    assert free.tokens.tolist() == [b, c, s.tool_call_end, d, a, b, c, s.tool_call_end]
    stopped = drv.run([Request(prompt, 8, jax.random.key(0), Sampling(1.0), stop_token_ids=(s.tool_call_end,))])[0]
    assert stopped.tokens.tolist() == [b, c, s.tool_call_end]
    assert (stopped.finish_reason, stopped.stop) == ("stop_token", s.tool_call_end)
    np.testing.assert_array_equal(stopped.logprobs, free.logprobs[:3])
    # The stop *string* "</tool_call>" is the same single token; a multi-token string stops on decoded text.
    by_string = drv.run([Request(prompt, 8, jax.random.key(0), stop_strings=("</tool_call>",))])[0]
    assert by_string.tokens.tolist() == [b, c, s.tool_call_end] and by_string.finish_reason == "stop_token"
    text = tokenizer.decode([c, s.tool_call_end])
    multi = drv.run([Request(prompt, 8, jax.random.key(0), stop_strings=(text[1:],))])[0]
    assert multi.tokens.tolist() == [b, c, s.tool_call_end]
    assert (multi.finish_reason, multi.stop) == ("stop_string", text[1:])


def test_a_continued_slot_has_the_logits_of_a_fresh_prefill(engine, tokenizer):
    """Generate 4 tokens (the slot stops on device), append more tokens to its cache: the next-token logits are
    those of the whole sequence prefilled afresh into another slot, in the same batched call."""
    placed, key = engine.load_params(), jax.random.key(3)
    prompt, more = tokenizer.encode(PROMPTS[1]), tokenizer.encode(" ".join(PROMPTS) * 2)
    assert len(more) > engine.max_prefill_length  # the continuation itself runs in two chunks
    state = engine.prefill_slots(placed, engine.init_decode_state(),
                                 [SlotPrefill(0, tuple(prompt), True, Sampling(1.0), key, max_new_tokens=4)])
    generated = []
    for _ in range(6):  # two steps past max_new_tokens: the slot must not feed anything more
        state, result = engine.generate(placed, state)
        token, valid, _ = np.asarray(result.data)[0].tolist()
        generated += [token] if valid else []
    assert len(generated) == 4 and int(state.cache.lengths[0]) == len(prompt) + 4
    sequence = tuple(prompt + generated + more)
    state = engine.prefill_slots(placed, state, [SlotPrefill(0, tuple(more), False, Sampling(1.0), key),
                                                 SlotPrefill(2, sequence, True, Sampling(1.0), key)])
    assert int(state.cache.lengths[0]) == int(state.cache.lengths[2]) == len(sequence)
    np.testing.assert_allclose(state.logits[0], state.logits[2], atol=1e-5, rtol=0)


def test_three_turns_with_cache_extension_equal_re_prefill(engine, params, tokenizer):
    """Each finished turn returns a follow-up = its whole sequence + new tokens (a tool response): with cache
    extension only the new tokens are prefilled, and tokens and log μ are those of re-prefilling everything."""
    extra = [tokenizer.encode(" Search results for the query: Paris."), tokenizer.encode(PROMPTS[1] * 3)]

    def next_turn(c):
        index, turn = c.request.tag
        if turn == 2:
            return []
        prompt = c.request.prompt + tuple(c.tokens.tolist()) + tuple(extra[turn])
        return [Request(prompt, 5, jax.random.fold_in(c.request.key, turn + 1), c.request.sampling,
                        stop_token_ids=c.request.stop_token_ids, tag=(index, turn + 1))]

    requests = [Request(tuple(tokenizer.encode(p)), 5, jax.random.key(i), Sampling(1.0), tag=(i, 0))
                for i, p in enumerate(PROMPTS[:5])]
    # The 3rd token request 0 samples becomes a stop id: a turn is also continued after a stop on device.
    stop = int(RolloutDriver(engine, params).run(requests[:1])[0].tokens[2])
    requests = [dataclasses.replace(r, stop_token_ids=(stop,)) for r in requests]
    runs, stats = {}, {}
    for extend in (True, False):
        drv = RolloutDriver(engine, params, extend_cache=extend)
        runs[extend] = {c.request.tag: c for c in drv.run(requests, on_finish=next_turn)}
        stats[extend] = drv.stats
    assert len(runs[True]) == len(runs[False]) == 15
    assert (stats[True].resumed, stats[False].resumed) == (10, 0)
    new_tokens = sum(len(r.prompt) for r in requests) + 5 * sum(len(x) for x in extra)
    assert stats[True].prefill_tokens == new_tokens < stats[False].prefill_tokens
    for tag, want in runs[False].items():
        got = runs[True][tag]
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5, rtol=0)
        assert got.finish_reason == want.finish_reason
    assert runs[True][0, 0].finish_reason == "stop_token" and len(runs[True][0, 0].tokens) == 3


def test_full_cache_finishes_with_context(engine, driver, tokenizer):
    prompt = tuple((tokenizer.encode(PROMPTS[1]) * 200)[: engine.max_len - 3])  # chunked prefill: 16 chunks
    c = driver.run([Request(prompt, 50, jax.random.key(1), Sampling(0.0))])[0]
    assert c.finish_reason == "context"
    assert len(prompt) + len(c.tokens) == engine.max_len  # a sequence never outgrows the cache


def test_params_swap_does_not_recompile(engine, driver, params, tokenizer):
    requests = _requests(tokenizer, Sampling(0.0))[:2]
    before = _by_tag(driver.run(requests))
    traces = dict(engine.trace_counts)
    other = params.replace(lm_head=-params.lm_head)  # same shapes, other weights
    driver.set_params(other)
    try:
        after = _by_tag(driver.run(requests))
    finally:
        driver.set_params(params)
    assert dict(engine.trace_counts) == traces
    assert any(before[i].tokens.tolist() != after[i].tokens.tolist() for i in before)
    bad = other.replace(embed=other.embed[:, :8])
    with pytest.raises(ValueError, match="embed"):
        driver.set_params(bad)


def test_bad_requests_are_rejected(driver, engine):
    with pytest.raises(ValueError, match="empty prompt"):
        driver.run([Request((), 4, jax.random.key(0))])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        driver.run([Request((engine.cfg.vocab_size,), 4, jax.random.key(0))])
    with pytest.raises(ValueError, match="max_new_tokens"):
        driver.run([Request((1, 2), 0, jax.random.key(0))])
    with pytest.raises(ValueError, match="no room to generate"):
        driver.run([Request((1,) * engine.max_len, 4, jax.random.key(0))])


@pytest.mark.slow
def test_sharded_engine_matches_one_device(engine, driver, cfg, params, tokenizer):
    """The engine on a 2x2 (fsdp, tensor) mesh of fake CPU devices gives the one-device results."""
    mesh = make_mesh({"fsdp": 2, "tensor": 2}, devices=jax.devices()[:4])
    sharded = SearchJaxEngine(cfg, params, tokenizer, max_concurrent_decodes=4, max_prefill_length=64,
                              max_len=engine.max_len, mesh=mesh)
    placed = sharded.load_params()
    assert any(len(leaf.sharding.device_set) == 4 and not leaf.sharding.is_fully_replicated
               for leaf in jax.tree.leaves(placed))
    assert sharded.init_decode_state().cache.k.sharding.spec[1] == "fsdp"  # slots split over fsdp
    requests = _requests(tokenizer, Sampling(0.0), max_new=(6,) * 4)[:4]
    want = _by_tag(driver.run(requests))
    got = _by_tag(RolloutDriver(sharded, params).run(requests))
    for tag, c in want.items():
        np.testing.assert_array_equal(got[tag].tokens, c.tokens)
