"""Rollout benchmarks, measured side by side in one run (preset `small`, CPU by default).

1. Batching gain: generated tokens/s of the RolloutDriver with N concurrent requests ÷ the same requests one
   at a time through the same engine (target >= 8x at N = 32); also ÷ one at a time on a 1-slot engine.
2. Host overhead per decode step at N concurrent: driver wall time per step − the device time of a step
   (back-to-back `generate` calls on a full batch, no host work), target <= 2 ms; and the driver's own
   bookkeeping time per step.
3. The same N-request workload through JetStream's own orchestrator (its Driver + LLMOrchestrator.Decode with
   token inputs, in-process), as a ratio of its tokens/s to ours.
4. Multi-turn (`--section multiturn`): 3-turn search rollouts (the agent's rendered prompt, real search_web
   response turns between the turns) with cache extension (each turn appends only the tool turn to its slot's
   cache) ÷ with the whole history re-prefilled every turn, generated tokens/s side by side.

    JAX_PLATFORMS=cpu python tools/bench_rollout.py [--preset small] [--section all|batching|multiturn]
        [--concurrent 32] [--new-tokens 32] [--rollouts 8] [--turns 3] [--turn-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
import time

import jax
import numpy as np

from searchjax import model as M
from searchjax.chat import render, train_tokenizer
from searchjax.data.prompts import prompt_messages
from searchjax.rollout import AgentConfig, PromptItem, Request, RolloutDriver, Sampling, SearchAgent, SearchJaxEngine
from searchjax.rollout.engine import SlotPrefill
from searchjax.rollout.jetstream_compat import jetstream_pb2, orchestrator
from searchjax.rollout.serve import make_driver
from searchjax.search import SEARCH_WEB_TOOL, MemoryBackend, SearchTool


def _tokenizer(root: str):
    path = os.path.join(root, "corpus.txt")
    with open(path, "w") as f:
        f.write("the quick brown fox jumps over the lazy dog; search the web for rivers and cities.\n" * 200)
    return train_tokenizer([path], 600)


def _requests(n: int, prompt_len: int, new_tokens: int, bos: int, vocab: int, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    key = jax.random.key(seed)
    return [
        Request((bos, *rng.integers(0, vocab, prompt_len - 1).tolist()), new_tokens, jax.random.fold_in(key, i),
                Sampling(1.0), tag=i)
        for i in range(n)
    ]


def _driver_rate(driver: RolloutDriver, requests: list[Request], serial: bool) -> tuple[float, float, int]:
    """(tokens/s, wall s, steps) of running the requests together or one at a time."""
    t0, tokens, steps = time.perf_counter(), 0, 0
    batches = [[r] for r in requests] if serial else [requests]
    for batch in batches:
        tokens += sum(len(c.tokens) for c in driver.run(batch))
        steps += driver.stats.steps
    wall = time.perf_counter() - t0
    return tokens / wall, wall, steps


def _device_step_s(engine: SearchJaxEngine, params, requests: list[Request], steps: int) -> float:
    """Seconds per `generate` on a full batch, dispatched back to back with no host work in between."""
    batch = [SlotPrefill(slot, r.prompt, True, r.sampling, r.key)
             for slot, r in enumerate(requests[: engine.max_concurrent_decodes])]
    state = engine.prefill_slots(params, engine.init_decode_state(), batch)
    state, result = engine.generate(params, state)
    jax.block_until_ready(result.data)
    t0 = time.perf_counter()
    for _ in range(steps):
        state, result = engine.generate(params, state)
    jax.block_until_ready(result.data)
    return (time.perf_counter() - t0) / steps


def _jetstream_rate(engine: SearchJaxEngine, params, requests: list[Request], new_tokens: int) -> tuple[float, float]:
    """(tokens/s, wall s) of the same prompts through JetStream's orchestrator (greedy, engine default)."""
    driver = make_driver(engine, params)
    servicer = orchestrator.LLMOrchestrator(driver)

    async def one(r: Request) -> int:
        # JetStream prepends its BOS itself: send the prompt without ours.
        req = jetstream_pb2.DecodeRequest(max_tokens=new_tokens, token_content={"token_ids": list(r.prompt[1:])})
        n = 0
        async for response in servicer.Decode(req):
            n += sum(len(s.token_ids) for s in response.stream_content.samples)
        return n

    async def everything() -> int:
        return sum(await asyncio.gather(*(one(r) for r in requests)))

    loop = asyncio.new_event_loop()  # closed only after the driver's threads stop (they signal into it)
    try:
        loop.run_until_complete(everything())  # warm-up
        t0 = time.perf_counter()
        tokens = loop.run_until_complete(everything())
        wall = time.perf_counter() - t0
    finally:
        driver.stop()
        loop.close()
    return tokens / wall, wall


RIVERS = ("Avon", "Thames", "Severn", "Trent", "Wye", "Tees", "Exe", "Tyne", "Ouse", "Dee")
DOCS = [{"title": f"River {r}", "url": f"https://w.example/{r.lower()}",
         "text": f"The river {r} flows through several cities; the quick brown fox jumps over the lazy dog near "
                 f"the {r}. Search the web for rivers and cities: the {r} is one of them."} for r in RIVERS]


def _question(i: int) -> dict:
    return {"id": str(i), "question": f"Which cities does the river {RIVERS[i % 10]} flow through?"}


def _chat_tokenizer(root: str, turns: int):
    """A tokenizer trained on the agent's rendered prompts and search responses, so that they compress about as
    a real one compresses them (a few hundred tokens each), not character by character."""
    tool = SearchTool(MemoryBackend(DOCS), 10 * turns)
    texts = [render(prompt_messages(_question(i), turns), tools=[SEARCH_WEB_TOOL]) for i in range(10)]
    texts += [tool.call({"query": f"river {r} cities"}).text for r in RIVERS]
    path = os.path.join(root, "chat.txt")
    with open(path, "w") as f:
        f.write("\n".join(texts) * 5)
    return train_tokenizer([path], 1000)


def _search_rollouts(driver: RolloutDriver, n: int, new_tokens: int, turns: int):
    """n 3-turn search rollouts as the agent builds them: the rendered prompt (tools, budget, question), then per
    turn `new_tokens` generated tokens followed by a real search_web response turn (up to 10 results).

    Returns (first requests, on_finish, (prompt tokens, tool-turn tokens)): on_finish returns the next turn,
    prompt + generated + tool turn, exactly what SearchAgent sends (the random model never stops by itself).
    """
    agent = SearchAgent(driver, MemoryBackend(DOCS), AgentConfig(budget=turns))
    key = jax.random.key(1)
    items = [PromptItem.from_record(_question(i), turns) for i in range(n)]
    tool = SearchTool(agent.backend, turns)
    harness = [agent.tool_turn_ids([tool.call({"query": f"river {RIVERS[i % 10]} cities"}).text], close_turn=True)
               for i in range(n)]
    first = [Request(tuple(agent.prompt_ids(item)), new_tokens, jax.random.fold_in(key, i), Sampling(1.0),
                     tag=(i, 0)) for i, item in enumerate(items)]

    def on_finish(c) -> list[Request]:
        i, turn = c.request.tag
        if turn + 1 == turns:
            return []
        prompt = c.request.prompt + tuple(c.tokens.tolist()) + tuple(harness[i])
        return [Request(prompt, new_tokens, jax.random.fold_in(c.request.key, turn + 1), Sampling(1.0),
                        tag=(i, turn + 1))]

    return first, on_finish, (len(first[0].prompt), len(harness[0]))


def _multi_turn(engine: SearchJaxEngine, params, args) -> None:
    """3-turn search rollouts: generated tokens/s with cache extension ÷ with the whole history re-prefilled."""
    drivers = {extend: RolloutDriver(engine, params, extend_cache=extend) for extend in (True, False)}
    first, on_finish, (prompt, tool) = _search_rollouts(drivers[True], args.rollouts, args.turn_tokens, args.turns)
    for d in drivers.values():  # compile every shape both modes use
        d.run(first, on_finish=on_finish)
    best = {}
    for _ in range(args.repeats):  # alternate the two modes; keep each one's best (the machine is shared)
        for extend, d in drivers.items():
            t0 = time.perf_counter()
            tokens = sum(len(c.tokens) for c in d.run(first, on_finish=on_finish))
            rate = tokens / (time.perf_counter() - t0)
            if rate > best.get(extend, (0.0,))[0]:
                best[extend] = (rate, d.stats.prefill_tokens, d.stats.resumed)
    (ext, ext_prefill, resumed), (re, re_prefill, _) = best[True], best[False]
    print(f"multi-turn: {args.rollouts} rollouts x {args.turns} turns x {args.turn_tokens} new tokens; prompt "
          f"{prompt} tokens, each tool turn {tool} tokens; slots {engine.max_concurrent_decodes}, max_prefill_length "
          f"{engine.max_prefill_length}")
    print(f"  cache extension: {ext:9.1f} tokens/s ({ext_prefill} tokens prefilled, {resumed} turns continued)")
    print(f"  re-prefill:      {re:9.1f} tokens/s ({re_prefill} tokens prefilled)")
    print(f"  cache extension / re-prefill: {ext / re:.2f}x   (>= 1.5x expected on the small preset)")


def _batching(cfg, params, tokenizer, args) -> None:
    """Sections 1-3 of the module docstring."""
    common = dict(max_prefill_length=64, max_len=args.prompt_len + args.new_tokens + 8, sampling=Sampling(0.0))
    engine = SearchJaxEngine(cfg, params, tokenizer, max_concurrent_decodes=args.concurrent, **common)
    single = SearchJaxEngine(cfg, params, tokenizer, max_concurrent_decodes=1, **common)
    reqs = _requests(args.concurrent, args.prompt_len, args.new_tokens, tokenizer.special.endoftext, 600)
    driver, driver1 = RolloutDriver(engine, params), RolloutDriver(single, params)
    placed = driver.params
    for d, batch in ((driver, reqs), (driver, reqs[:1]), (driver1, reqs[:1])):  # compile (P = 32 and P = 1 rows)
        d.run(batch)

    # Alternate the driver and the bare device loop a few times; keep each one's best (the machine is shared).
    best = None
    device = float("inf")
    for _ in range(args.repeats):
        batched, wall_b, steps_b = _driver_rate(driver, reqs, serial=False)
        if best is None or batched > best[0]:
            best = (batched, wall_b, steps_b, driver.stats)
        device = min(device, _device_step_s(engine, placed, reqs, driver.stats.steady_steps))
    batched, wall_b, steps_b, stats = best
    host_s, steady = stats.host_s / stats.steps, stats.steady_s / max(stats.steady_steps, 1)
    serial, _, _ = _driver_rate(driver, reqs[: args.serial_requests], serial=True)
    serial1, _, _ = _driver_rate(driver1, reqs[: args.serial_requests], serial=True)
    jet, _ = _jetstream_rate(engine, placed, reqs, args.new_tokens)

    print(f"batching: concurrent={args.concurrent} prompt={args.prompt_len} new={args.new_tokens}")
    print(f"driver, {args.concurrent} concurrent:        {batched:9.1f} tokens/s ({steps_b} steps, {wall_b:.2f} s)")
    print(f"driver, one at a time (same engine):  {serial:9.1f} tokens/s")
    print(f"driver, one at a time (1-slot engine): {serial1:8.1f} tokens/s")
    print(f"batching gain vs same engine:          {batched / serial:8.1f}x   (target >= 8x)")
    print(f"batching gain vs 1-slot engine:        {batched / serial1:8.1f}x")
    print(f"device step (full batch, no host):     {device * 1e3:8.2f} ms")
    print(f"driver decode step ({stats.steady_steps} steady steps): {steady * 1e3:8.2f} ms")
    print(f"host overhead per step (driver-device): {(steady - device) * 1e3:7.2f} ms   (target <= 2 ms)")
    print(f"host bookkeeping per step (measured):  {host_s * 1e3:8.2f} ms")
    print(f"JetStream orchestrator:                {jet:9.1f} tokens/s = {jet / batched:.2f}x ours")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--section", choices=("all", "batching", "multiturn"), default="all")
    ap.add_argument("--concurrent", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--serial-requests", type=int, default=4, help="requests timed one at a time (a rate)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating measurements of the compared modes")
    ap.add_argument("--rollouts", type=int, default=8, help="multi-turn: concurrent search rollouts (= slots)")
    ap.add_argument("--turns", type=int, default=3, help="multi-turn: assistant turns per rollout")
    ap.add_argument("--turn-tokens", type=int, default=32, help="multi-turn: generated tokens per turn")
    ap.add_argument("--max-prefill-length", type=int, default=256, help="multi-turn: the engine's prefill chunk")
    args = ap.parse_args()
    logging.getLogger().setLevel(logging.ERROR)  # JetStream warns once per in-process Decode call

    with tempfile.TemporaryDirectory() as root:
        tokenizer = _tokenizer(root)
    cfg = M.load_preset(args.preset)
    params = M.init_params(cfg, jax.random.key(0))
    print(f"preset={args.preset} devices={jax.devices()[0].platform}")
    if args.section in ("all", "batching"):
        _batching(cfg, params, tokenizer, args)
    if args.section in ("all", "multiturn"):
        with tempfile.TemporaryDirectory() as root:
            chat = _chat_tokenizer(root, args.turns)
        cfg = cfg.replace(vocab_size=max(cfg.vocab_size, chat.vocab_size))
        params = M.init_params(cfg, jax.random.key(0))
        engine = SearchJaxEngine(cfg, params, chat, max_concurrent_decodes=args.rollouts, max_len=4096,
                                 max_prefill_length=args.max_prefill_length)
        _multi_turn(engine, params, args)


if __name__ == "__main__":
    main()
