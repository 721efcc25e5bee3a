"""`SearchJaxEngine`: the Qwen3.5 model behind JetStream's Engine API (google-jetstream 0.2.2).

Continuous batching over `max_concurrent_decodes` slots. Through JetStream's API a request is prefilled alone
into a batch-1 hybrid cache (attention KV + DeltaNet conv + recurrent state), then `insert`ed into a free slot
of the batched decode state; every `generate` call advances all slots by one token. The rollout driver uses
the searchjax extension `prefill_slots` instead: several requests prefilled at once straight into their slots,
each either afresh or appended to what its slot already holds (the next turn of a multi-turn rollout
continues the cache of the previous one instead of prefilling the whole history again).

Stops on device: a slot admitted by `prefill_slots` carries its stop ids and max_new_tokens, and stops feeding
its cache in the very `generate` step that samples a stop id or its last allowed token. The driver reads
tokens one step late (it pipelines), so without this the slot would already have fed one more token; with it
the slot's cache holds exactly prompt + generated tokens, which is what a continuation appends to.

Sampling lives in `generate`, not in `prefill`: a prefix carries the logits of the next token, and each
`generate` first *samples* from the pending logits of every slot (temperature / top-k / top-p per slot,
searchjax.rollout.sampling), then feeds the sampled token through `decode_step` to get the next logits. So the
first generated token is returned by `generate` like every other one, and its log-probability μ_infer is
computed from exactly the distribution it was drawn from.

Randomness: slot b's n-th token uses the key fold_in(k_b, n), where k_b is the request's own key. A request's
samples therefore depend on its key and its tokens only, never on the slot it got or on the other requests in
the batch (continuous batching changes nothing but speed).

Parameters are an argument of every jitted function, so a params tree with the same shapes, dtypes and
shardings can be swapped between rollout phases without recompiling (`trace_counts` counts traces).

Routing replay (record_routes=True): the engine also returns, for every token it feeds through the model, the
experts each MoE layer sent it to ([L, k] ids; `prefill_slots_routed` for prefilled tokens, `SampledTokens.routes`
for generated ones). The trainer's forward can then route every token as the sampler did
(`searchjax.model.hidden_states(routes=...)`): top-k routing is discontinuous, and a router near-tie that the
two numerically different paths (chunked prefill and decode here, one full forward there) break differently
sends a token to another expert and shifts every later log-probability (RESULTS.md, the canary).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from searchjax import model as M
from searchjax.model.cache import put_rows, take_rows
from searchjax.model.transformer import prefill_last
from searchjax.chat.tokenizer import Tokenizer, load_tokenizer
from searchjax.rollout.jetstream_compat import engine_api, token_utils, tokenizer_api, tokenizer_pb2
from searchjax.rollout.sampling import Sampling, SamplingArrays, sample
from searchjax.sharding import make_mesh

# The prefill buckets of JetStream's pad_tokens; max_prefill_length must be one of them.
PREFILL_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
MAX_STOP_IDS = 8  # stop token ids a slot checks on device
NO_LIMIT = np.iinfo(np.int32).max  # max_new of a slot without a device-side token limit (JetStream's insert)


@struct.dataclass
class Prefix:
    """One prefilled request: its batch-1 cache, next-token logits [1,V] f32, sampling [1] and key data [1,k]."""

    cache: Any
    logits: jax.Array
    sampling: SamplingArrays
    key: jax.Array


@struct.dataclass
class DecodeState:
    """The batched decode state over B slots.

    cache: the hybrid cache [B, ...]; logits [B,V] f32 of each slot's next token; sampling [B]; key data [B,k];
    generated [B] i32 tokens produced since insert; active [B] bool (a slot stops when its cache is full, and
    after it sampled one of its stop_ids [B, MAX_STOP_IDS] i32 (−1 = none) or its max_new [B] i32-th token).
    """

    cache: Any
    logits: jax.Array
    sampling: SamplingArrays
    keys: jax.Array
    generated: jax.Array
    active: jax.Array
    stop_ids: jax.Array
    max_new: jax.Array


@dataclasses.dataclass(frozen=True)
class SlotPrefill:
    """One request for `SearchJaxEngine.prefill_slots`.

    slot: the decode slot; tokens: the ids to append; fresh: start from an empty cache (a new request) rather
    than append to what the slot holds (a continuation); sampling, key (typed PRNG key): the request's own;
    stop_ids (at most MAX_STOP_IDS) and max_new_tokens: where the slot stops feeding its cache on device.
    """

    slot: int
    tokens: tuple[int, ...]
    fresh: bool
    sampling: Sampling
    key: jax.Array
    stop_ids: tuple[int, ...] = ()
    max_new_tokens: int = NO_LIMIT


@struct.dataclass
class SampledTokens(engine_api.ResultTokens):
    """JetStream's ResultTokens ([B, token | valid | length] int32) plus log μ_infer of each token, [B] f32, and
    with record_routes the experts each fed token went to, [B, L, k] i32 (−1 where the token was not fed)."""

    logprobs: Any = None
    routes: Any = None

    def copy_to_host_async(self) -> None:
        for x in (self.data, self.logprobs, self.routes):
            if isinstance(x, jax.Array):
                x.copy_to_host_async()

    def convert_to_numpy(self) -> "SampledTokens":
        return SampledTokens(
            np.asarray(self.data), self.tokens_idx, self.valid_idx, self.length_idx, self.samples_per_slot,
            logprobs=np.asarray(self.logprobs), routes=None if self.routes is None else np.asarray(self.routes),
        )


class PrefillRoutes:
    """The experts of one request's prefilled tokens, [n, L, k], still on the device until `numpy()` is called
    (pieces of the chunked prefill: (routes [P, T, L, k], row, count) each, their host copies started)."""

    def __init__(self, pieces: Sequence[tuple[jax.Array, int, int]]):
        self._pieces = list(pieces)

    def numpy(self) -> np.ndarray:
        parts = [np.asarray(a)[row, :n] for a, row, n in self._pieces]
        return np.concatenate(parts, axis=0).astype(np.int16)


class JetStreamTokenizer(tokenizer_api.Tokenizer):
    """searchjax's chat tokenizer seen through JetStream's Tokenizer API.

    JetStream prepends `bos_id` to every new request; Qwen has no BOS token, and `<|endoftext|>` (the id Qwen's
    config names as bos, and its pad token) is used. Generation stops on `<|im_end|>` and `<|endoftext|>`.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def encode(self, s: str, **kwargs):
        """(padded ids, true length) of `s`, padded to JetStream's prefill buckets."""
        ids = np.asarray(self.tokenizer.encode(s), np.int32)
        return token_utils.pad_tokens(
            ids, self.bos_id, self.pad_id,
            is_bos=kwargs.pop("is_bos", True),
            prefill_lengths=kwargs.pop("prefill_lengths", None),
            max_prefill_length=kwargs.pop("max_prefill_length", None),
            jax_padding=kwargs.pop("jax_padding", True),
        )

    def decode(self, token_ids: list[int], **kwargs) -> str:
        del kwargs
        return self.tokenizer.decode(token_ids)

    @property
    def pad_id(self) -> int:
        return self.tokenizer.special.pad

    @property
    def eos_id(self) -> int:
        return self.tokenizer.special.im_end

    @property
    def bos_id(self) -> int:
        return self.tokenizer.special.endoftext

    @property
    def stop_tokens(self) -> set[int]:
        return set(self.tokenizer.special.stop_ids)


def _check_sizes(max_concurrent_decodes: int, max_prefill_length: int, max_len: int) -> None:
    if max_concurrent_decodes < 1:
        raise ValueError(f"max_concurrent_decodes must be >= 1, got {max_concurrent_decodes}")
    if max_prefill_length not in PREFILL_BUCKETS:
        raise ValueError(
            f"max_prefill_length must be one of JetStream's prefill buckets {list(PREFILL_BUCKETS)}, "
            f"got {max_prefill_length}"
        )
    if max_len < max_prefill_length:
        raise ValueError(f"max_len ({max_len}) must be >= max_prefill_length ({max_prefill_length})")


class SearchJaxEngine(engine_api.Engine):
    """The Qwen3.5 policy as a JetStream engine (see the module docstring for the sampling contract).

    Args:
      cfg: the model config. params: a params pytree (host or device), placed by `load_params`.
      tokenizer: searchjax's chat tokenizer (its `source` path is what `get_tokenizer` advertises).
      max_concurrent_decodes: number of slots B. max_prefill_length: the longest single prefill (a JetStream
        bucket); longer prompts are prefilled in chunks by the rollout driver. max_len: cache length per slot.
      sampling: the settings used for requests that do not bring their own (JetStream's orchestrator).
      seed: base key of requests without their own key. mesh: defaults to the first device.
      record_routes: also return the experts of every token fed (routing replay; module docstring).
    """

    def __init__(
        self,
        cfg: M.ModelConfig,
        params: Any,
        tokenizer: Tokenizer,
        *,
        max_concurrent_decodes: int = 8,
        max_prefill_length: int = 256,
        max_len: int = 1024,
        cache_dtype: str = "float32",
        sampling: Sampling = Sampling(),
        seed: int = 0,
        mesh: Mesh | None = None,
        record_routes: bool = False,
    ):
        _check_sizes(max_concurrent_decodes, max_prefill_length, max_len)
        self.record_routes = bool(record_routes)
        if max_len > cfg.max_position_embeddings:
            raise ValueError(f"max_len ({max_len}) exceeds the model's max_position_embeddings ({cfg.max_position_embeddings})")
        self.cfg, self.tokenizer, self.default_sampling = cfg, tokenizer, sampling
        self.max_len, self.cache_dtype = max_len, jnp.dtype(cache_dtype)
        self._batch, self._max_prefill = max_concurrent_decodes, max_prefill_length
        self._mesh = mesh if mesh is not None else make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
        self._params = params
        self._base_key = jax.random.key(seed)
        self._request_counter = itertools.count()
        self.trace_counts: collections.Counter[str] = collections.Counter()
        self._replicated = NamedSharding(self._mesh, PartitionSpec())
        self._build_jitted()

    @classmethod
    def from_dir(cls, model_dir: str, tokenizer_path: str | None = None, **kwargs) -> "SearchJaxEngine":
        """An engine over an HF checkpoint directory (config.json + safetensors) and its tokenizer.json.

        The tokenizer is read from `tokenizer_path`, or from `model_dir` when not given.
        """
        cfg, params = M.load_hf(model_dir)
        tokenizer = load_tokenizer(tokenizer_path or model_dir)
        if tokenizer.vocab_size > cfg.vocab_size:
            raise ValueError(
                f"{tokenizer.source}: the tokenizer has {tokenizer.vocab_size} ids but the model in {model_dir} "
                f"only {cfg.vocab_size} embedding rows"
            )
        return cls(cfg, params, tokenizer, **kwargs)

    # ---------------------------------------------------------------- jitted kernels
    def _build_jitted(self) -> None:
        """Jit the kernels once per engine, with the shardings of what they return."""
        repl = self._replicated
        prefix_shardings = self._shardings(1, Prefix)
        state_shardings = self._shardings(self._batch, DecodeState)
        self._copy = jax.jit(lambda p: jax.tree.map(jnp.copy, p))
        self._fresh_cache = jax.jit(self._zero_cache, out_shardings=prefix_shardings.cache)
        self._init_state = jax.jit(self._zero_state, out_shardings=state_shardings)
        self._prefill = jax.jit(self._prefill_step, out_shardings=prefix_shardings)
        slots_out = (state_shardings, repl) if self.record_routes else state_shardings
        self._prefill_slots = jax.jit(self._prefill_slots_step, donate_argnums=(1,), out_shardings=slots_out)
        self._insert = jax.jit(self._insert_step, donate_argnums=(1,), out_shardings=state_shardings)
        self._generate = jax.jit(
            self._generate_step, donate_argnums=(1,),
            out_shardings=(state_shardings, repl, repl) + ((repl,) if self.record_routes else ()),
        )

    def _zeros(self, shapes):
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def _zero_cache(self):
        """An empty batch-1 cache (the start of every new request)."""
        self.trace_counts["init_cache"] += 1
        return self._zeros(M.cache_shapes(self.cfg, 1, self.max_len, self.cache_dtype))

    def _zero_state(self) -> DecodeState:
        """An empty decode state: every slot inactive, caches zero, default sampling."""
        self.trace_counts["init_decode_state"] += 1
        b, s = self._batch, self.default_sampling
        return DecodeState(
            cache=self._zeros(M.cache_shapes(self.cfg, b, self.max_len, self.cache_dtype)),
            logits=jnp.zeros((b, self.cfg.vocab_size), jnp.float32),
            sampling=SamplingArrays(
                temperature=jnp.full((b,), s.temperature, jnp.float32),
                top_p=jnp.full((b,), s.top_p, jnp.float32),
                top_k=jnp.full((b,), s.top_k, jnp.int32),
            ),
            keys=jnp.zeros((b, jax.random.key_data(self._base_key).shape[-1]), jnp.uint32),
            generated=jnp.zeros((b,), jnp.int32),
            active=jnp.zeros((b,), bool),
            stop_ids=jnp.full((b, MAX_STOP_IDS), -1, jnp.int32),
            max_new=jnp.full((b,), NO_LIMIT, jnp.int32),
        )

    def _prefill_step(self, params, tokens, true_length, cache, sampling, key) -> Prefix:
        """Append tokens[0, :true_length] to the batch-1 cache; keep the logits of the last real position."""
        self.trace_counts["prefill"] += 1
        lengths = jnp.reshape(true_length, (1,)).astype(jnp.int32)
        last, cache = prefill_last(params, tokens, self.cfg, cache, lengths)
        return Prefix(cache=cache, logits=last.astype(jnp.float32), sampling=sampling, key=key)

    def _prefill_slots_step(self, params, state: DecodeState, slots, tokens, lengths, fresh, sampling, keys,
                            stop_ids, max_new):
        """Append tokens [P,T] (lengths [P]) to the caches of `slots` [P] (emptied first where fresh [P]) and make
        those slots generate from their last token's logits; a slot index >= B is a padding row (writes nothing).
        Returns the new DecodeState, and with record_routes the experts of the tokens [P,T,L,k] too."""
        self.trace_counts["prefill_slots"] += 1
        rows = take_rows(state.cache, slots, empty=fresh)
        last, rows, routes = prefill_last(params, tokens, self.cfg, rows, lengths, return_routes=True)
        put = lambda full, part: full.at[slots].set(part.astype(full.dtype), mode="drop")  # noqa: E731
        p = slots.shape[0]
        new = DecodeState(
            cache=put_rows(state.cache, slots, rows),
            logits=put(state.logits, last),
            sampling=jax.tree.map(put, state.sampling, sampling),
            keys=put(state.keys, keys),
            generated=put(state.generated, jnp.zeros((p,), jnp.int32)),
            active=put(state.active, jnp.ones((p,), bool)),
            stop_ids=put(state.stop_ids, stop_ids),
            max_new=put(state.max_new, max_new),
        )
        return (new, routes) if self.record_routes else new

    def _insert_step(self, prefix: Prefix, state: DecodeState, slot) -> DecodeState:
        """Row `slot` of the decode state becomes the prefix (cache, pending logits, sampling, key); no device stops
        (JetStream's orchestrator stops requests on the host)."""
        self.trace_counts["insert"] += 1
        put = lambda full, row: full.at[slot].set(row[0])  # noqa: E731
        return DecodeState(
            cache=M.insert_cache(state.cache, prefix.cache, slot),
            logits=put(state.logits, prefix.logits),
            sampling=jax.tree.map(put, state.sampling, prefix.sampling),
            keys=put(state.keys, prefix.key),
            generated=state.generated.at[slot].set(0),
            active=state.active.at[slot].set(True),
            stop_ids=state.stop_ids.at[slot].set(-1),
            max_new=state.max_new.at[slot].set(NO_LIMIT),
        )

    def _shardings(self, batch: int, kind: type):
        """Shardings of a Prefix (batch 1) or DecodeState: the cache by its logical axes, the rest replicated."""
        repl = self._replicated
        cache = M.cache_shardings(self.cfg, batch, self.max_len, self._mesh, self.cache_dtype)
        sampling = SamplingArrays(temperature=repl, top_p=repl, top_k=repl)
        if kind is Prefix:
            return Prefix(cache=cache, logits=repl, sampling=sampling, key=repl)
        return DecodeState(cache=cache, logits=repl, sampling=sampling, keys=repl, generated=repl, active=repl,
                           stop_ids=repl, max_new=repl)

    def _generate_step(self, params, state: DecodeState):
        """Sample every slot from its pending logits, then feed the samples through decode_step.

        A slot stays active after this step iff it fed its token and that token is neither one of its stop ids
        nor its max_new-th: a stopped slot's cache holds exactly its prompt and its generated tokens.
        """
        self.trace_counts["generate"] += 1
        keys = jax.vmap(lambda kd, n: jax.random.fold_in(jax.random.wrap_key_data(kd), n))(
            state.keys, state.generated
        )
        tokens, logprobs = sample(keys, state.logits, state.sampling)
        # A slot whose cache is full still returns the token sampled from its last logits, then stops.
        feed = state.active & (state.cache.lengths < self.max_len)
        logits, cache, routes = M.decode_step(params, tokens, self.cfg, state.cache, active=feed, return_routes=True)
        generated = state.generated + state.active.astype(jnp.int32)
        stopped = jnp.any(tokens[:, None] == state.stop_ids, axis=1) | (generated >= state.max_new)
        new_state = DecodeState(
            cache=cache,
            logits=jnp.where(feed[:, None], logits.astype(jnp.float32), state.logits),
            sampling=state.sampling,
            keys=state.keys,
            generated=generated,
            active=feed & ~stopped,
            stop_ids=state.stop_ids,
            max_new=state.max_new,
        )
        data = jnp.stack([tokens, state.active.astype(jnp.int32), generated], axis=1)
        logprobs = jnp.where(state.active, logprobs, 0.0)
        if self.record_routes:
            return new_state, data, logprobs, jnp.where(feed[:, None, None], routes, -1)
        return new_state, data, logprobs

    # ---------------------------------------------------------------- Engine API
    def load_params(self, *args, **kwargs) -> Any:
        """The engine's params, placed on its mesh with the model's parameter shardings."""
        del args, kwargs
        return self.place_params(self._params)

    def place_params(self, params: Any) -> Any:
        """Put any params tree of this model on the engine's mesh (also for swapping policy/reference), always as
        new buffers: a trainer that donates its state to the next step never deletes the engine's weights."""
        shardings = M.param_shardings(self.cfg, self._mesh)
        placed = jax.device_put(params, shardings)
        # device_put may hand back the source's own per-device buffers (a reshard that keeps a shard where it is,
        # whatever may_alias says); a jitted copy owns fresh ones.
        return self._copy(placed)

    def prefill(
        self,
        *,
        params: Any,
        existing_prefix: Prefix | None = None,
        padded_tokens: jax.Array,
        true_length: int,
        sampling: Sampling | None = None,
        key: jax.Array | None = None,
    ) -> Prefix:
        """Prefill `padded_tokens[:true_length]` (after `existing_prefix`'s tokens when given).

        `sampling` and `key` (a typed PRNG key) are searchjax extensions used by the rollout driver; JetStream's
        orchestrator passes neither, and gets the engine's default sampling and a fresh key per request.
        """
        tokens = jnp.asarray(padded_tokens, jnp.int32).reshape(1, -1)
        if not 0 < int(true_length) <= tokens.shape[1]:
            raise ValueError(f"prefill: true_length {true_length} not in [1, {tokens.shape[1]}]")
        if existing_prefix is None:
            cache = self._fresh_cache()
            sampling_arrays = SamplingArrays.of(sampling or self.default_sampling)
            if key is None:
                key = jax.random.fold_in(self._base_key, next(self._request_counter))
            key_data = jax.random.key_data(key)[None, :]
        else:
            cache, sampling_arrays, key_data = existing_prefix.cache, existing_prefix.sampling, existing_prefix.key
            if sampling is not None or key is not None:
                raise ValueError("prefill: a continuation keeps its prefix's sampling and key; pass neither")
        return self._prefill(params, tokens, jnp.int32(true_length), cache, sampling_arrays, key_data)

    def prefill_slots(self, params: Any, state: DecodeState, requests: Sequence[SlotPrefill]) -> DecodeState:
        """Prefill several requests into their slots at once (searchjax extension; the rollout driver's admission).

        Each `SlotPrefill` appends its tokens to its slot's cache, an empty one when `fresh`, and the slot then
        generates as if its whole sequence had been prefilled and `insert`ed: its own sampling and key (token n
        uses fold_in(key, n)), its stop ids and max_new_tokens checked on device. The requests run P rows at a
        time, P padded to a power of two (at most B) with rows that write nothing, in chunks of
        max_prefill_length padded to JetStream's buckets: the compiled shapes are (P bucket, T bucket). The
        caller keeps each slot's length + len(tokens) < max_len (the driver checks it). `state` is donated.
        """
        return self._prefill_requests(params, state, requests)[0]

    def prefill_slots_routed(self, params: Any, state: DecodeState,
                             requests: Sequence[SlotPrefill]) -> tuple[DecodeState, list[PrefillRoutes]]:
        """`prefill_slots`, also returning the experts of each request's tokens (engine built with record_routes)."""
        if not self.record_routes:
            raise ValueError("prefill_slots_routed: this engine was built with record_routes=False")
        return self._prefill_requests(params, state, requests)

    def _prefill_requests(self, params, state, requests):
        """(state, one PrefillRoutes per request, or None without record_routes): see `prefill_slots`."""
        seen = [r.slot for r in requests]
        if len(set(seen)) != len(seen) or not all(0 <= s < self._batch for s in seen):
            raise ValueError(f"prefill_slots: slots {seen} must be distinct and in [0, {self._batch})")
        for r in requests:
            if not r.tokens or len(r.stop_ids) > MAX_STOP_IDS or r.max_new_tokens < 1:
                raise ValueError(f"prefill_slots: slot {r.slot} needs tokens, at most {MAX_STOP_IDS} stop ids and "
                                 f"max_new_tokens >= 1 (got {len(r.tokens)} tokens, {len(r.stop_ids)} stop ids, "
                                 f"max_new_tokens {r.max_new_tokens})")
        chunk = self._max_prefill
        pieces: dict[int, list] = {r.slot: [] for r in requests}
        for start in range(0, max((len(r.tokens) for r in requests), default=0), chunk):
            part = [r for r in requests if len(r.tokens) > start]
            out = self._prefill_slots(params, state, *self._slot_arrays(part, start, chunk))
            if not self.record_routes:
                state = out
                continue
            state, routes = out
            routes.copy_to_host_async()
            for row, r in enumerate(part):
                pieces[r.slot].append((routes, row, min(chunk, len(r.tokens) - start)))
        if not self.record_routes:
            return state, None
        return state, [PrefillRoutes(pieces[r.slot]) for r in requests]

    def _slot_arrays(self, part: Sequence[SlotPrefill], start: int, chunk: int) -> tuple:
        """The kernel's arguments for tokens[start : start + chunk] of each request, padded to the buckets."""
        pieces = [r.tokens[start : start + chunk] for r in part]
        t = prefill_bucket(max(len(x) for x in pieces), chunk)
        p = min(1 << (len(part) - 1).bit_length(), self._batch)
        tokens, lengths = np.zeros((p, t), np.int32), np.zeros((p,), np.int32)
        slots, fresh = np.full((p,), self._batch, np.int32), np.zeros((p,), bool)
        stops, max_new = np.full((p, MAX_STOP_IDS), -1, np.int32), np.ones((p,), np.int32)
        for i, (r, piece) in enumerate(zip(part, pieces)):
            tokens[i, : len(piece)], lengths[i], slots[i] = piece, len(piece), r.slot
            fresh[i], max_new[i] = r.fresh and start == 0, r.max_new_tokens
            stops[i, : len(r.stop_ids)] = r.stop_ids
        rows = [r.sampling for r in part] + [self.default_sampling] * (p - len(part))
        keys = jnp.stack([jax.random.key_data(r.key) for r in part])
        keys = jnp.pad(keys, ((0, p - len(part)), (0, 0)))
        return slots, tokens, lengths, fresh, SamplingArrays.of(rows), keys, stops, max_new

    def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int) -> DecodeState:
        if not 0 <= slot < self._batch:
            raise ValueError(f"insert: slot {slot} not in [0, {self._batch})")
        return self._insert(prefix, decode_state, jnp.int32(slot))

    def generate(self, params: Any, decode_state: DecodeState) -> tuple[DecodeState, SampledTokens]:
        state, data, logprobs, *routes = self._generate(params, decode_state)
        return state, SampledTokens(data, (0, 1), (1, 2), (2, 3), 1, logprobs=logprobs,
                                    routes=routes[0] if routes else None)

    def init_decode_state(self, *args, **kwargs) -> DecodeState:
        """An empty decode state: every slot inactive, caches zero."""
        del args, kwargs
        return self._init_state()

    def get_prefix_destination_sharding(self) -> Prefix:
        """A Prefix of NamedShardings: the batch-1 cache by its logical axes, the rest replicated."""
        return self._shardings(1, Prefix)

    def get_tokenizer(self) -> tokenizer_pb2.TokenizerParameters:
        return tokenizer_pb2.TokenizerParameters(path=self.tokenizer.source)

    def build_tokenizer(self, metadata: tokenizer_pb2.TokenizerParameters) -> JetStreamTokenizer:
        if metadata.path == self.tokenizer.source:
            return JetStreamTokenizer(self.tokenizer)
        return JetStreamTokenizer(load_tokenizer(metadata.path))

    @property
    def max_concurrent_decodes(self) -> int:
        return self._batch

    @property
    def samples_per_slot(self) -> int:
        return 1

    @property
    def max_prefill_length(self) -> int:
        return self._max_prefill

    @property
    def mesh(self) -> Mesh:
        return self._mesh

    @property
    def colocated_cpus(self) -> None:
        return None


def prefill_bucket(length: int, max_prefill_length: int) -> int:
    """The padded length JetStream uses for `length` tokens (the smallest bucket >= length, capped)."""
    buckets = [b for b in PREFILL_BUCKETS if b <= max_prefill_length]
    return next((b for b in buckets if b >= length), buckets[-1] if buckets else max_prefill_length)
