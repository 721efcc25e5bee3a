"""Rollout benchmarks, measured side by side in one run (preset `small`, CPU by default).

1. Batching gain: generated tokens/s of the RolloutDriver with N concurrent requests ÷ the same requests one
   at a time through the same engine (target >= 8x at N = 32); also ÷ one at a time on a 1-slot engine.
2. Host overhead per decode step at N concurrent: driver wall time per step − the device time of a step
   (back-to-back `generate` calls on a full batch, no host work), target <= 2 ms; and the driver's own
   bookkeeping time per step.
3. The same N-request workload through JetStream's own orchestrator (its Driver + LLMOrchestrator.Decode with
   token inputs, in-process), as a ratio of its tokens/s to ours.

    JAX_PLATFORMS=cpu python tools/bench_rollout.py [--preset small] [--concurrent 32] [--new-tokens 32]
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
from searchjax.chat import train_tokenizer
from searchjax.rollout import Request, RolloutDriver, Sampling, SearchJaxEngine
from searchjax.rollout.jetstream_compat import jetstream_pb2, orchestrator
from searchjax.rollout.serve import make_driver


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
    state = engine.init_decode_state()
    drv = RolloutDriver(engine, params)
    for slot, r in enumerate(requests[: engine.max_concurrent_decodes]):
        state = engine.insert(drv._prefill(r), state, slot)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--concurrent", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--serial-requests", type=int, default=4, help="requests timed one at a time (a rate)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating driver / device-loop measurements")
    args = ap.parse_args()
    logging.getLogger().setLevel(logging.ERROR)  # JetStream warns once per in-process Decode call

    with tempfile.TemporaryDirectory() as root:
        tokenizer = _tokenizer(root)
    cfg = M.load_preset(args.preset)
    params = M.init_params(cfg, jax.random.key(0))
    common = dict(max_prefill_length=64, max_len=args.prompt_len + args.new_tokens + 8, sampling=Sampling(0.0))
    engine = SearchJaxEngine(cfg, params, tokenizer, max_concurrent_decodes=args.concurrent, **common)
    single = SearchJaxEngine(cfg, params, tokenizer, max_concurrent_decodes=1, **common)
    reqs = _requests(args.concurrent, args.prompt_len, args.new_tokens, tokenizer.special.endoftext, 600)
    driver, driver1 = RolloutDriver(engine, params), RolloutDriver(single, params)
    placed = driver.params
    for d in (driver, driver1):  # compile
        d.run(reqs[:2])

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

    print(f"preset={args.preset} concurrent={args.concurrent} prompt={args.prompt_len} new={args.new_tokens} "
          f"devices={jax.devices()[0].platform}")
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


if __name__ == "__main__":
    main()
