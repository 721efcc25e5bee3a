"""The RL rollout driver: a queue of requests → continuous batching over the engine's slots → completions.

It runs the engine's decode loop (`generate`, as JetStream's orchestrator does) in one thread, admitting
requests with the engine's batched `prefill_slots`: every request that finds a free slot in a loop iteration
is prefilled in the same call. It records what the orchestrator does not: for every request the sampled ids,
log μ_infer of each one (the log-probability under the distribution it was sampled from, RECIPE.md §2), the
finish reason, and per-request stops. Finish reasons:

    stop_token   the last token is one of the request's stop ids (it is kept: the trainer sees it)
    stop_string  the decoded tail of the generation contains one of the request's stop strings
    max_tokens   max_new_tokens were generated
    context      prompt + generation reached the engine's max_len (the cache is full); a sequence never has
                 more than max_len tokens, so a record of it fits the trainer's [·, max_len] arrays

The loop is pipelined: step t+1 is dispatched before the tokens of step t are read on the host, so host work
overlaps device work. A slot that finished at step t therefore runs one wasted step, whose token is ignored.
Requests may be added while running (`on_finish` returns follow-ups, e.g. the next turn of an agent).

Cache extension: a follow-up whose prompt is the finished request's prompt + generated tokens + more (the
agent's next turn: the tool response and the generation prompt) keeps the finished request's slot, and only
the new tokens are prefilled onto its cache. That is exact because the engine stops a slot on device at its
stop id or max_new_tokens (the slot holds exactly prompt + generated), and it samples the same tokens with
the same log μ as a fresh prefill of the whole prompt (up to float rounding: chunk boundaries differ).
Requests ending on a multi-token stop string or a full cache are not continued; `extend_cache=False` turns
the extension off.

Routing replay: with an engine built with record_routes=True every completion also carries `routes`
[len(prompt) + len(tokens), L, k] int16, the experts each position's token went to in each MoE layer when the
engine fed it (−1 for a token never fed: the last one of a full cache). A continuation's routes start with its
predecessor's, so the routes of the last turn of an agent rollout are the sampler's view of the whole history.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

from searchjax.rollout.engine import MAX_STOP_IDS, SearchJaxEngine, SlotPrefill
from searchjax.rollout.sampling import Sampling

FINISH_REASONS = ("stop_token", "stop_string", "max_tokens", "context")


@dataclasses.dataclass(frozen=True)
class Request:
    """One generation request.

    prompt: token ids (the full context so far); max_new_tokens >= 1; sampling; key: a typed PRNG key (the
    request's own random stream); stop_token_ids / stop_strings: where to stop; tag: anything of the caller's.
    """

    prompt: tuple[int, ...]
    max_new_tokens: int
    key: jax.Array
    sampling: Sampling = Sampling()
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    tag: Any = None


@dataclasses.dataclass
class Completion:
    """What a request produced: tokens[n] int32, logprobs[n] f32 (log μ_infer), why it stopped, timings; routes
    (record_routes engines) [len(prompt) + n, L, k] int16, the experts of every position (module docstring)."""

    request: Request
    tokens: np.ndarray
    logprobs: np.ndarray
    finish_reason: str
    stop: int | str | None
    queued_s: float
    decode_s: float
    routes: np.ndarray | None = None


@dataclasses.dataclass
class DriverStats:
    """Counters of one `run`.

    steps: decode steps; tokens: generated tokens; wall_s: the whole run; host_s: host bookkeeping after each
    step's tokens arrived (not the wait for them); steady_steps / steady_s: loop iterations that admitted no
    request (pure decode), and their wall time: steady_s / steady_steps is the cost of a decode step as seen
    by the driver, device time plus whatever host time is not hidden behind it. prefill_tokens: tokens
    prefilled; resumed: requests that continued the cache of the slot their predecessor finished in.
    """

    steps: int = 0
    tokens: int = 0
    requests: int = 0
    wall_s: float = 0.0
    host_s: float = 0.0
    steady_steps: int = 0
    steady_s: float = 0.0
    prefill_tokens: int = 0
    resumed: int = 0


class _Live:
    """A request in a slot: its tokens so far, stop sets and the first step whose output is its own."""

    def __init__(self, request: Request, first_step: int, stop_ids: frozenset[int], stop_strings, window, t0):
        self.request, self.first_step, self.t_queued, self.t_admit = request, first_step, t0, time.perf_counter()
        self.stop_ids, self.stop_strings, self.window = stop_ids, stop_strings, window
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.routes: list = []  # np arrays [n, L, k] and PrefillRoutes, in position order (record_routes)


@dataclasses.dataclass(frozen=True)
class _Admission:
    """A request about to be prefilled into `slot`; `cached` of its prompt tokens are already in the slot, whose
    routes are `prior` (the predecessor's, record_routes)."""

    slot: int
    request: Request
    cached: int
    t_queued: float
    prior: np.ndarray | None = None


class RolloutDriver:
    """Continuous batching over a `SearchJaxEngine` for RL rollouts (see module docstring)."""

    def __init__(self, engine: SearchJaxEngine, params: Any, extend_cache: bool = True):
        """extend_cache=False prefills every follow-up afresh (the reference the cache extension is tested and
        benchmarked against)."""
        self.engine, self.extend_cache = engine, extend_cache
        self.tokenizer = engine.tokenizer
        self.params = engine.place_params(params)
        self.version = 0  # the policy version: how many times set_params swapped the weights in
        self.stats = DriverStats()

    def set_params(self, params: Any, version: int | None = None) -> None:
        """Swap the weights (e.g. policy ↔ reference, or after a train step) without recompiling; version += 1,
        or `version` when given (a resumed trainer sets the version of the weights it restored).

        The new tree must match the old one in structure, shapes and dtypes, or a ValueError names the leaf
        (`cast_like` casts a trainer's float32 tree to the engine's dtypes first).
        """
        old = jax.tree_util.tree_flatten_with_path(self.params)[0]
        new = jax.tree_util.tree_flatten_with_path(params)[0]
        if jax.tree.structure(self.params) != jax.tree.structure(params):
            raise ValueError("set_params: the new params tree has a different structure from the current one")
        for (path, a), (_, b) in zip(old, new):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise ValueError(
                    f"set_params: {jax.tree_util.keystr(path)} is {b.shape} {b.dtype}, expected {a.shape} {a.dtype}"
                )
        self.params = self.engine.place_params(params)
        self.version = self.version + 1 if version is None else int(version)

    def cast_like(self, params: Any) -> Any:
        """`params` with every leaf cast to the dtype of the driver's current leaf (e.g. float32 master weights
        to a bfloat16 engine); the placement onto the engine's mesh is `set_params`'s."""
        return jax.tree.map(lambda p, old: p.astype(old.dtype) if p.dtype != old.dtype else p, params, self.params)

    # ------------------------------------------------------------------ admission
    def _check(self, request: Request) -> None:
        n, vocab = len(request.prompt), self.engine.cfg.vocab_size
        if n == 0:
            raise ValueError(f"request {request.tag!r}: empty prompt")
        if n >= self.engine.max_len:
            raise ValueError(f"request {request.tag!r}: prompt of {n} tokens leaves no room to generate in the cache "
                             f"of {self.engine.max_len} positions")
        if request.max_new_tokens < 1:
            raise ValueError(f"request {request.tag!r}: max_new_tokens must be >= 1, got {request.max_new_tokens}")
        bad = [t for t in request.prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"request {request.tag!r}: token ids {bad[:5]} outside the vocabulary [0, {vocab})")
        stop_ids = self._stops(request)[0]
        if len(stop_ids) > MAX_STOP_IDS:
            raise ValueError(f"request {request.tag!r}: {len(stop_ids)} stop token ids (stop_token_ids and the "
                             f"single-token stop_strings); at most {MAX_STOP_IDS}")

    def _stops(self, request: Request) -> tuple[frozenset[int], tuple[str, ...], int]:
        """Stop ids, the stop strings that are not single tokens, and the token window that can contain them."""
        ids, strings = set(request.stop_token_ids), []
        for s in request.stop_strings:
            encoded = self.tokenizer.encode(s)
            if len(encoded) == 1 and self.tokenizer.decode(encoded) == s:
                ids.add(encoded[0])
            else:
                strings.append(s)
        # Each token decodes to >= 1 byte, so a string of m bytes ending in the newest token lies in its last m.
        window = max((len(s.encode()) for s in strings), default=0) + 1
        return frozenset(ids), tuple(strings), window

    # ------------------------------------------------------------------ the loop
    def run(
        self,
        requests: Iterable[Request],
        on_finish: Callable[[Completion], Iterable[Request] | None] | None = None,
    ) -> list[Completion]:
        """Generate every request (and every follow-up `on_finish` returns); completions in finishing order."""
        engine, t_start = self.engine, time.perf_counter()
        pending = collections.deque((r, t_start) for r in requests)
        for r, _ in pending:
            self._check(r)
        slots: list[_Live | None] = [None] * engine.max_concurrent_decodes
        free = list(range(engine.max_concurrent_decodes))[::-1]
        resumed: list[_Admission] = []  # follow-ups that continue the cache of the slot they finished in
        state, step, inflight, done = engine.init_decode_state(), 0, None, []
        stats = DriverStats()
        while True:
            t_iter, admit, resumed = time.perf_counter(), resumed, []
            while free and pending:
                request, t_queued = pending.popleft()
                admit.append(_Admission(free.pop(), request, 0, t_queued))
            if admit:
                state = self._admit(state, admit, slots, step, stats)
            dispatched = None
            if any(s is not None for s in slots):
                state, result = engine.generate(self.params, state)
                result.copy_to_host_async()
                dispatched, step = (step, result), step + 1
            if inflight is not None:
                for slot, c in self._process(inflight, slots, stats):
                    done.append(c)
                    follow_ups = list((on_finish(c) if on_finish else None) or ())
                    kept = self._place(c, slot, follow_ups, pending, resumed)
                    if not kept:
                        free.append(slot)
            if not admit and inflight is not None and dispatched is not None:
                stats.steady_steps += 1
                stats.steady_s += time.perf_counter() - t_iter
            inflight = dispatched
            if inflight is None and not pending and not resumed:
                break
        stats.steps, stats.requests, stats.wall_s = step, len(done), time.perf_counter() - t_start
        self.stats = stats
        return done

    def _place(self, c: Completion, slot: int, follow_ups: list[Request], pending, resumed) -> bool:
        """Queue `c`'s follow-ups; the first that continues c's sequence keeps c's slot. Returns whether one did."""
        kept = False
        for follow in follow_ups:
            self._check(follow)
            cached = 0 if kept else self._cached_length(c, follow)
            if cached:
                prior = None if c.routes is None else c.routes[:cached]
                resumed.append(_Admission(slot, follow, cached, time.perf_counter(), prior))
                kept = True
            else:
                pending.append((follow, time.perf_counter()))
        return kept

    def _cached_length(self, c: Completion, follow: Request) -> int:
        """How many of `follow`'s prompt tokens c's slot already holds: n = |prompt| + |generated| when follow's
        prompt starts with c's whole sequence and is longer, and c stopped on device (a stop id or
        max_new_tokens: not a stop string, after which the slot ran on, nor a full cache); else 0."""
        if not self.extend_cache or c.finish_reason not in ("stop_token", "max_tokens"):
            return 0
        n, head = len(c.request.prompt) + len(c.tokens), len(c.request.prompt)
        if len(follow.prompt) <= n or follow.prompt[:head] != c.request.prompt:
            return 0
        return n if list(follow.prompt[head:n]) == c.tokens.tolist() else 0

    def _admit(self, state, admit: list[_Admission], slots: list[_Live | None], step: int, stats: DriverStats):
        """Prefill the admitted requests into their slots, all in one `prefill_slots` call (continuations append
        only their new tokens); they own their slots from decode step `step` on."""
        batch = []
        for a in admit:
            stops = self._stops(a.request)
            batch.append(SlotPrefill(
                slot=a.slot, tokens=a.request.prompt[a.cached :], fresh=a.cached == 0, sampling=a.request.sampling,
                key=a.request.key, stop_ids=tuple(sorted(stops[0])), max_new_tokens=a.request.max_new_tokens,
            ))
            slots[a.slot] = _Live(a.request, step, *stops, a.t_queued)
            stats.prefill_tokens += len(a.request.prompt) - a.cached
            stats.resumed += a.cached > 0
        if not self.engine.record_routes:
            return self.engine.prefill_slots(self.params, state, batch)
        state, routes = self.engine.prefill_slots_routed(self.params, state, batch)
        for a, r in zip(admit, routes):
            slots[a.slot].routes += ([] if a.prior is None else [a.prior]) + [r]
        return state

    def _process(self, inflight, slots: list[_Live | None], stats: DriverStats) -> list[tuple[int, Completion]]:
        """Read one step's tokens on the host; finish the requests that stopped: (their slots, completions)."""
        step, result = inflight
        data = np.asarray(result.data).tolist()
        logprobs = np.asarray(result.logprobs).tolist()
        routes = None if result.routes is None else np.asarray(result.routes).astype(np.int16)
        t_host = time.perf_counter()
        finished = []
        for slot, live in enumerate(slots):
            if live is None or live.first_step > step:
                continue
            token, valid, _ = data[slot]
            if valid and routes is not None:
                live.routes.append(routes[slot][None])
            reason, stop = ("context", None) if not valid else self._append(live, token, logprobs[slot])
            stats.tokens += int(bool(valid))
            if reason is not None:
                finished.append((slot, self._complete(live, reason, stop)))
                slots[slot] = None
        stats.host_s += time.perf_counter() - t_host
        return finished

    def _append(self, live: _Live, token: int, logprob: float) -> tuple[str | None, int | str | None]:
        live.tokens.append(token)
        live.logprobs.append(logprob)
        if token in live.stop_ids:
            return "stop_token", token
        if live.stop_strings:
            tail = self.tokenizer.decode(live.tokens[-live.window :])
            hit = next((s for s in live.stop_strings if s in tail), None)
            if hit is not None:
                return "stop_string", hit
        if len(live.tokens) >= live.request.max_new_tokens:
            return "max_tokens", None
        if len(live.request.prompt) + len(live.tokens) >= self.engine.max_len:
            return "context", None
        return None, None

    @staticmethod
    def _complete(live: _Live, reason: str, stop) -> Completion:
        now = time.perf_counter()
        return Completion(
            request=live.request,
            tokens=np.asarray(live.tokens, np.int32),
            logprobs=np.asarray(live.logprobs, np.float32),
            finish_reason=reason,
            stop=stop,
            queued_s=live.t_admit - live.t_queued,
            decode_s=now - live.t_admit,
            routes=np.concatenate([r if isinstance(r, np.ndarray) else r.numpy() for r in live.routes])
            if live.routes else None,
        )

