"""s(τ_i) = P̄(x, y_i, y_ref) for the GRPO reward (RECIPE.md §4): in process (`PreferenceScorer`) or as a loopback
HTTP service shared by rollout workers on other hosts (`RewardModelServer`, `RewardModelClient`).

`PreferenceScorer.score(prompts, rollouts, references)` renders and tokenises each (x, a = rollout, b = reference)
triple (searchjax.data.preferences.encode_prompt_response), lays out the two rows of its scorer
(searchjax.rewards.reward_model: x‖a, x‖b pointwise; x‖A‖a‖B‖b‖E, x‖A‖b‖B‖a‖E pairwise), and runs both orders
of `batch_pairs` pairs in ONE jitted call over [2·batch_pairs, W] tokens, W the smallest of `buckets` that holds
the batch's longest row (pairs sorted by length first, so batches are even and the shapes few: one compile per
bucket). A reward model with the likelihood term (searchjax.rewards.reward_model) also needs each response's
assistant-token mask: its triples are (x, a, b, mask_a, mask_b), as `encode_triples` makes them. Each pair is laid out in a canonical order (the lexicographically smaller response first), so (a, b)
and (b, a) run the identical rows and P̄(x, a, b) + P̄(x, b, a) = 1 exactly. Batches are dispatched before any
result is fetched, so host-side packing overlaps the device.

Service protocol (JSON over HTTP/1.1, keep-alive; the search service's connection handling, searchjax.search.http):
- `POST /score` with `{"prompts": [conversation], "rollouts": [turns], "references": [turns]}` (equal lengths;
  each item a list of OpenAI-style messages, or a string: a user turn for prompts, an assistant turn otherwise)
  answers `200 {"scores": [P̄, ...]}`;
- `GET /health` answers `200 {"ok": true, "scorer": "pointwise" | "pairwise"}`;
- errors are JSON `{"error": str}`: 400 for a bad request (the field and item named, or a pair longer than the
  largest bucket), 404 / 405 / 408 as the search service, 500 when scoring fails.
The client retries connection errors, timeouts and 5xx at most `retries` more times, then raises
`RewardServiceError` naming the service and the last failure: a dead or slow service is an error after at most
(retries + 1) · timeout_s plus the back-off, never a hang.
"""

from __future__ import annotations

import bisect
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from searchjax.chat import load_tokenizer
from searchjax.data.preferences import as_messages, encode_prompt_response
from searchjax.rewards.reward_model import RewardParams, Scorer, averaged_preference, load_reward_model
from searchjax.search.http import HttpBackend, SearchHTTPServer, _BadRequest, _Handler, _Transient

DEFAULT_PORT = 8766
DEFAULT_BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192)
MAX_REQUEST_BYTES = 64 << 20
Triple = tuple[Sequence[int], ...]  # (x, a, b) ids; with a likelihood-term reward model also (mask_a, mask_b)


class RewardServiceError(RuntimeError):
    """The reward-model service gave no usable answer (unreachable, too slow, an HTTP error, a malformed body)."""


def _row(pieces) -> list[int]:
    return [int(i) for piece in pieces for i in piece]


class PreferenceScorer:
    """P̄(x, a, b) of a reward model for batches of pairs, both orders in one jitted call (module docstring).

    `params` may be replaced between calls (the training loop's dev evaluation does so); shapes, hence compiled
    functions, depend only on `batch_pairs` and `buckets`.
    """

    def __init__(self, params: RewardParams, scorer: Scorer, encode: Callable[[str], list[int]], *,
                 batch_pairs: int = 8, buckets: Sequence[int] = DEFAULT_BUCKETS,
                 tools: Sequence[dict[str, Any]] | None = None):
        if batch_pairs < 1 or not buckets or min(buckets) < 1:
            raise ValueError(f"PreferenceScorer: need batch_pairs >= 1 and positive buckets, got {batch_pairs}, "
                             f"{list(buckets)}")
        self.params, self.scorer, self.encode, self.tools = params, scorer, encode, tools
        self.batch_pairs, self.buckets = batch_pairs, tuple(sorted(set(int(b) for b in buckets)))
        self._marks = scorer.template
        self._forward = jax.jit(self._both_orders)

    @classmethod
    def load(cls, path: str | Path, dtype: str = "float32", mesh=None, **kwargs) -> "PreferenceScorer":
        """The scorer of a reward-model checkpoint (save_reward_model) with the tokenizer.json stored beside it,
        on `mesh` (default: the first device)."""
        params, scorer = load_reward_model(path, dtype, mesh)
        return cls(params, scorer, load_tokenizer(path).encode, **kwargs)

    @property
    def kind(self) -> str:
        return self.scorer.kind

    @property
    def needs_masks(self) -> bool:
        """Whether triples must carry the responses' assistant masks (a reward model with the likelihood term)."""
        return self.scorer.likelihood

    def _both_orders(self, params, tokens, lengths, swap, mask=None):
        """(P̄, Δ(x, a, b), Δ(x, b, a), the likelihood part of Δ̄(x, a, b)) [P] from rows [first rows of the P
        pairs; their second rows] (`Scorer.row_deltas` with parts=True)."""
        first, second, lik = self.scorer.row_deltas(params, tokens, lengths, mask, parts=True)
        d_ab, d_ba = jnp.where(swap, second, first), jnp.where(swap, first, second)
        return averaged_preference(d_ab, d_ba), d_ab, d_ba, jnp.where(swap, -lik, lik)

    def bucket(self, length: int) -> int:
        """The smallest bucket holding `length` tokens (ValueError past the largest)."""
        i = bisect.bisect_left(self.buckets, length)
        if i == len(self.buckets):
            raise ValueError(f"a pair's row has {length} tokens, more than the largest bucket {self.buckets[-1]}; "
                             "pass larger buckets")
        return self.buckets[i]

    def rows(self, x: Sequence[int], a: Sequence[int], b: Sequence[int], mask_a: Sequence[int] | None = None,
             mask_b: Sequence[int] | None = None):
        """(first row, second row, swapped, first row's mask, second row's mask): the pair's two rows in canonical
        order, whether a and b were swapped to get it, and with the likelihood term their assistant masks (None
        otherwise; a ValueError when that scorer gets no masks)."""
        swap = tuple(a) > tuple(b)
        first, second = self.scorer.rows(x, *((b, a) if swap else (a, b)), self._marks)
        if not self.scorer.likelihood:
            return _row(first), _row(second), swap, None, None
        if mask_a is None or mask_b is None or len(mask_a) != len(a) or len(mask_b) != len(b):
            raise ValueError("this reward model has the likelihood term: each triple needs (x, a, b, mask_a, mask_b) "
                             "with one mask entry per response token (encode_triples makes them)")
        m1, m2 = self.scorer.mask_rows(len(x), *((mask_b, mask_a) if swap else (mask_a, mask_b)))
        return _row(first), _row(second), swap, m1, m2

    def _batches(self, triples: Sequence[Triple]):
        """(pair indices, tokens [2B, W], lengths [2B], swap [B], mask [2B, W] or None) per batch, pairs sorted by
        row length."""
        laid = [self.rows(*t) for t in triples]
        longest = [max(len(r[0]), len(r[1])) for r in laid]
        for n in longest:
            self.bucket(n)  # every pair fits before any work starts
        order = sorted(range(len(laid)), key=lambda i: (longest[i], i))
        pad, b = self.scorer.pad_id, self.batch_pairs
        for start in range(0, len(order), b):
            idx = order[start:start + b]
            width = self.bucket(max(longest[i] for i in idx))
            tokens = np.full((2 * b, width), pad, np.int32)
            lengths = np.ones((2 * b,), np.int32)  # filler rows: one pad token, results dropped
            swap = np.zeros((b,), bool)
            mask = np.zeros((2 * b, width), np.int32) if self.scorer.likelihood else None
            for j, i in enumerate(idx):
                r1, r2, swap[j], m1, m2 = laid[i]
                tokens[j, : len(r1)], tokens[b + j, : len(r2)] = r1, r2
                lengths[j], lengths[b + j] = len(r1), len(r2)
                if mask is not None:
                    mask[j, : len(m1)], mask[b + j, : len(m2)] = m1, m2
            yield idx, tokens, lengths, swap, mask

    def _run(self, triples: Sequence[Triple]) -> np.ndarray:
        """`_both_orders`' four results, float32 [4, N], for token-id triples (x, a, b)."""
        out = np.zeros((4, len(triples)), np.float32)
        pending = [(idx, self._forward(self.params, tokens, lengths, swap, mask))  # dispatched, not yet fetched
                   for idx, tokens, lengths, swap, mask in self._batches(triples)]
        for idx, result in pending:
            out[:, idx] = np.stack([np.asarray(r) for r in result])[:, : len(idx)]
        return out

    def deltas_ids(self, triples: Sequence[Triple]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(P̄, Δ(x, a, b), Δ(x, b, a)), float32 [N] each, for token-id triples (x, a, b)."""
        p, d_ab, d_ba, _ = self._run(triples)
        return p, d_ab, d_ba

    def logit_parts(self, triples: Sequence[Triple]) -> dict[str, np.ndarray]:
        """The preference logit Δ̄(x, a, b) (P̄ = σ(Δ̄)) of token-id triples and its two parts, float32 [N] each:
        "likelihood", β · (ℓ_a − ℓ_b) of the likelihood term (0 without it), and "head", the value head's rest,
        Δ̄ − likelihood (`Scorer.row_deltas`). Which part moves with a response's length or tool calls says
        what the reward model rewards in rollouts unlike its training pairs."""
        _, d_ab, d_ba, lik = self._run(triples)
        logit = 0.5 * (d_ab - d_ba)
        return {"logit": logit, "head": logit - lik, "likelihood": lik}

    def score_ids(self, triples: Sequence[Triple]) -> np.ndarray:
        """P̄(x, a, b), float32 [N], for token-id triples (x, a, b)."""
        return self.deltas_ids(triples)[0]

    def encode_triples(self, prompts: Sequence, rollouts: Sequence, references: Sequence) -> list[Triple]:
        """Token ids (x, a, b) of each (prompt, rollout, reference): strings or message lists (as_messages); with
        the likelihood term (x, a, b, mask_a, mask_b), the masks marking the assistant's tokens."""
        if not len(prompts) == len(rollouts) == len(references):
            raise ValueError(f"prompts, rollouts and references differ in length: {len(prompts)}, {len(rollouts)}, "
                             f"{len(references)}")
        triples = []
        for i, (x, a, b) in enumerate(zip(prompts, rollouts, references)):
            turns = [as_messages(x, f"prompts[{i}]", "user"), as_messages(a, f"rollouts[{i}]", "assistant"),
                     as_messages(b, f"references[{i}]", "assistant")]
            x_ids, pieces, *masks = encode_prompt_response(self.encode, turns[0], turns[1:], self.tools,
                                                           masks=self.scorer.likelihood)
            triples.append((x_ids, *pieces, *(list(m) for m in (masks[0] if masks else ()))))
        return triples

    def score(self, prompts: Sequence, rollouts: Sequence, references: Sequence) -> np.ndarray:
        """s_i = P̄(x_i, rollout_i, reference_i), float32 [N] in [0, 1]."""
        return self.score_ids(self.encode_triples(prompts, rollouts, references))


# ---------------------------------------------------------------------------------------------------- service
def parse_score_request(body: bytes) -> tuple[list, list, list]:
    """(prompts, rollouts, references) of a POST /score body; _BadRequest naming the problem otherwise."""
    try:
        request = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _BadRequest(f"invalid JSON: {e}") from None
    fields = ("prompts", "rollouts", "references")
    if not isinstance(request, dict) or set(request) != set(fields):
        got = sorted(request) if isinstance(request, dict) else type(request).__name__
        raise _BadRequest(f"the body must be a JSON object with exactly the fields {list(fields)}, got {got}")
    lists = [request[f] for f in fields]
    if not all(isinstance(v, list) for v in lists) or len({len(v) for v in lists}) != 1:
        raise _BadRequest(f"fields {list(fields)} must be lists of the same length")
    return lists[0], lists[1], lists[2]


class _ScoreHandler(_Handler):
    server: "RewardModelServer"

    def do_GET(self):  # noqa: N802 - http.server's naming
        if self.path == "/health":
            self._reply(200, {"ok": True, "scorer": self.server.scorer.kind})
        else:
            self._reply(404, {"error": f"unknown path {self.path!r}; use POST /score or GET /health"})

    def do_POST(self):  # noqa: N802
        if self.path != "/score":
            self._reply(404, {"error": f"unknown path {self.path!r}; use POST /score"})
            return
        header = self.headers.get("Content-Length")
        length = int(header) if header is not None and header.isdigit() else -1
        if not 0 < length <= MAX_REQUEST_BYTES:
            self.close_connection = True  # an unread or unknown-length body would desynchronise keep-alive
            self._reply(400, {"error": f"Content-Length must be 1..{MAX_REQUEST_BYTES} bytes, got {header!r}"})
            return
        body = self._read_body(length)
        if body is None:
            return
        try:
            triples = self.server.scorer.encode_triples(*parse_score_request(body))
            for t in triples:  # a pair past the largest bucket is the request's fault: 400, before any work
                self.server.scorer.bucket(max(map(len, self.server.scorer.rows(*t)[:2])))
        except (_BadRequest, ValueError, TypeError) as e:
            self._reply(400, {"error": str(e)})
            return
        try:
            with self.server.lock:  # one batch at a time on the device
                scores = self.server.scorer.score_ids(triples)
        except Exception as e:  # noqa: BLE001 - the client must get an answer rather than a dropped connection
            self._reply(500, {"error": f"{type(e).__name__}: {e}"})
            return
        self._reply(200, {"scores": [float(s) for s in scores]})


class RewardModelServer(SearchHTTPServer):
    """The search service's threaded server (keep-alive, timeouts, connections cut on close) answering /score
    from a PreferenceScorer."""

    def __init__(self, scorer: PreferenceScorer, host: str = "127.0.0.1", port: int = DEFAULT_PORT):
        self.scorer, self.lock = scorer, threading.Lock()
        super().__init__(backend=None, host=host, port=port)
        self.RequestHandlerClass = _ScoreHandler  # the connection handling stays the search server's


def serve_reward_model(scorer: PreferenceScorer, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                       on_ready: Callable[[str], None] | None = None) -> None:
    """Serve `scorer` until interrupted; `on_ready(url)` runs once it listens."""
    server = RewardModelServer(scorer, host, port)
    if on_ready is not None:
        on_ready(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


class RewardModelClient(HttpBackend):
    """Client of the reward-model service: `score(prompts, rollouts, references)` as PreferenceScorer's, over
    one keep-alive connection per thread, with a timeout per attempt and bounded retries (module docstring)."""

    def __init__(self, url: str, timeout_s: float = 120.0, retries: int = 2, backoff_s: float = 0.1):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"reward-model service url must look like http://HOST:PORT, got {url!r}")
        super().__init__(url, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s)

    def _post(self, body: bytes):
        conn = self._connection()
        conn.request("POST", "/score", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response, response.read()

    def score(self, prompts: Sequence, rollouts: Sequence, references: Sequence) -> np.ndarray:
        body = json.dumps({"prompts": list(prompts), "rollouts": list(rollouts),
                           "references": list(references)}).encode("utf-8")
        last, started = "", time.monotonic()
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                status, data = self._attempt(body)
            except _Transient as e:
                last = str(e)
                continue
            if status != 200:
                raise RewardServiceError(f"reward-model service at {self.url} answered HTTP {status}: {data[:300]!r}")
            return _parse_scores(data, len(prompts), self.url)
        raise RewardServiceError(f"reward-model service at {self.url} failed after {self.retries + 1} attempts in "
                                 f"{time.monotonic() - started:.1f} s (timeout {self.timeout_s:g} s each): {last}")


def _parse_scores(data: bytes, n: int, url: str) -> np.ndarray:
    try:
        scores = json.loads(data)["scores"]
        out = np.asarray(scores, np.float32)
        if out.shape != (n,):
            raise ValueError(f"{out.shape[0] if out.ndim == 1 else out.shape} scores for {n} pairs")
    except (ValueError, KeyError, TypeError) as e:
        raise RewardServiceError(f"malformed response from the reward-model service at {url}: {e}") from None
    return out
