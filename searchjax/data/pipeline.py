"""Grain input pipelines: sources → per-process split → seeded shuffle → mix → render + tokenize → batch.

    source_i = EpochShuffle(records_i[p::P], seed_i)                (p = process index, P = process count)
    mixed    = mix(source_1 … source_n, weights)                   (RECIPE.md §3.3: 90% QA, 10% rubric chat)
    batches  = mixed.batch(B, drop_remainder=True).map(Encoder)    (render + tokenize + pad, a batch at a time)

Rendering and tokenizing a whole batch at once lets the shared system + tools prefix be encoded once and the rest
go through one `encode_batch` call; the result is the same as per-example encode(render(...)) (tested).

Everything upstream of the iterator is a grain `MapDataset`, i.e. random access by index: the order is a pure
function of (records, seed, weights, p, P), each process sees a disjoint share of every source, and the iterator
state (`get_state()` → {"next_index": k}) is all a checkpoint needs: `set_state` resumes with exactly the batches an
uninterrupted run would give. Save it with orbax beside the train state via
`grain.checkpoint.CheckpointSave(iterator)` / `CheckpointRestore(iterator)`.

Source kinds: "qa" and "rubric" become RL prompts (system turn with the tool budget + user turns, rendered with
the search_web tool and the generation prompt; loss_mask is all zero); "sft" records carry a full `messages`
conversation and become (ids, loss_mask) with the mask on assistant tokens only (`encode_conversation`).
Batches: input_ids, loss_mask [B, T] int32 (right-padded with the tokenizer's pad id to `max_len`), lengths [B],
source [B] (index into the config's sources) and records (the B source records, for rewards and logging).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import grain
import numpy as np

from searchjax.chat import Tokenizer, encode_conversation, render_segments
from searchjax.data.jsonl import DataError, ReadSummary, read_jsonl, require
from searchjax.data.prompts import prompt_messages
from searchjax.data.rubric_data import validate_rubric_record
from searchjax.search import SEARCH_WEB_TOOL

Kind = Literal["qa", "rubric", "sft"]
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SourceConfig:
    """One JSONL source; `weight` is its dataset-level share of the mix (normalised over sources)."""

    name: str
    path: str
    kind: Kind = "qa"
    weight: float = 1.0


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """A pipeline; YAML presets live in configs/data/ (load with `searchjax.config.load_yaml`)."""

    sources: tuple[SourceConfig, ...]
    seed: int = 0
    batch_size: int = 8
    max_len: int = 2048
    tool_budget: int = 5
    enable_thinking: bool = True
    on_error: Literal["raise", "skip"] = "raise"  # malformed JSONL rows: stop at file:line, or skip and count
    overflow: Literal["error", "truncate"] = "error"  # examples longer than max_len
    read_threads: int = 0  # 0: read in the consuming thread; >0: grain prefetch threads

    def __post_init__(self):
        # TypeError, as searchjax.config expects of __post_init__ checks: load_yaml names the file then.
        if not self.sources:
            raise TypeError("PipelineConfig.sources: at least one source is required")
        if any(s.weight <= 0 for s in self.sources):
            raise TypeError(f"PipelineConfig.sources: weights must be > 0, got {[s.weight for s in self.sources]}")
        kinds = [s.kind for s in self.sources if s.kind not in VALIDATORS]
        if kinds:
            raise TypeError(f"PipelineConfig.sources: unknown kind(s) {kinds}; expected one of {list(VALIDATORS)}")
        if self.batch_size < 1 or self.max_len < 8:
            raise TypeError(f"PipelineConfig: batch_size >= 1 and max_len >= 8 required, got "
                            f"{self.batch_size}, {self.max_len}")
        if self.tool_budget < 0 or self.read_threads < 0:
            raise TypeError(f"PipelineConfig: tool_budget and read_threads must be >= 0, got "
                            f"{self.tool_budget}, {self.read_threads}")
        if self.on_error not in ("raise", "skip") or self.overflow not in ("error", "truncate"):
            raise TypeError(f"PipelineConfig: on_error must be raise|skip and overflow error|truncate, got "
                            f"{self.on_error!r}, {self.overflow!r}")


def _validate_qa(row: dict[str, Any]) -> None:
    require(row, "question", str)
    require(row, "answer", str)


def _validate_sft(row: dict[str, Any]) -> None:
    msgs = require(row, "messages", list)
    if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in msgs):
        raise ValueError("field 'messages': an SFT conversation needs at least one assistant turn")


VALIDATORS = {"qa": _validate_qa, "rubric": validate_rubric_record, "sft": _validate_sft}


def load_source(src: SourceConfig, on_error: str = "raise") -> tuple[list[dict[str, Any]], ReadSummary]:
    """Read and validate one source's JSONL (malformed rows raise with file:line, or are skipped and counted)."""
    if src.kind not in VALIDATORS:
        raise ValueError(f"source {src.name!r}: unknown kind {src.kind!r}; expected one of {list(VALIDATORS)}")
    return read_jsonl(src.path, validate=VALIDATORS[src.kind], on_error=on_error)


def load_sources(cfg: PipelineConfig) -> tuple[list[list[dict[str, Any]]], list[ReadSummary]]:
    """Every source's records and read summary; skipped rows (on_error: skip) are also logged as a warning
    naming the source, the count and the first reasons, so nothing is dropped silently."""
    records, summaries = [], []
    for src in cfg.sources:
        rows, summary = load_source(src, cfg.on_error)
        if summary.skipped:
            log.warning("source %r: skipped %d malformed row(s) of %d: %s", src.name, len(summary.skipped),
                        len(summary.skipped) + summary.kept, "; ".join(summary.skipped[:3]))
        records.append(rows)
        summaries.append(summary)
    return records, summaries


class Encoder:
    """Renders, tokenizes, pads and stacks a batch of (source index, record) pairs (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, cfg: PipelineConfig, tools: Sequence[Mapping[str, Any]] | None = None):
        self.tok, self.cfg = tokenizer, cfg
        self.tools = list(tools) if tools is not None else [SEARCH_WEB_TOOL]
        self.pad = tokenizer.special.pad
        self._head_cache: dict[str, list[int]] = {}

    def _head(self, system: dict[str, str]) -> list[int]:
        """Ids of the system + tools segment, rendered and encoded once per distinct system turn."""
        key = system["content"]
        if key not in self._head_cache:
            segments = render_segments([system, {"role": "user", "content": "."}], self.tools,
                                       add_generation_prompt=False)
            self._head_cache[key] = self.tok.encode(segments[0].text)
        return self._head_cache[key]

    def prompt_ids(self, records: Sequence[dict[str, Any]]) -> list[np.ndarray]:
        """Token ids of rendered RL prompts, the rest of each prompt encoded in one `encode_batch` call.

        The system + tools segment is the same for almost every prompt and ends with <|im_end|>\\n, a boundary
        no pre-token straddles, so it is encoded once; the rest (user turns + generation prompt) renders without
        it exactly as inside the full conversation (a test checks ids == encode(render(...)))."""
        heads, rests = [], []
        for record in records:
            system, *turns = prompt_messages(record, self.cfg.tool_budget)
            rest = render_segments(turns, None, add_generation_prompt=True, enable_thinking=self.cfg.enable_thinking)
            heads.append(self._head(system))
            rests.append("".join(s.text for s in rest))
        return [np.asarray(h + r, np.int32) for h, r in zip(heads, self.tok.encode_batch(rests))]

    def sft_ids(self, record: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        return encode_conversation(record["messages"], self.tok, self.tools,
                                   enable_thinking=self.cfg.enable_thinking)

    def __call__(self, pairs: Sequence[tuple[int, dict[str, Any]]], kinds: Sequence[Kind]) -> dict[str, Any]:
        prompts = [i for i, (src, _) in enumerate(pairs) if kinds[src] != "sft"]
        encoded: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for i, ids in zip(prompts, self.prompt_ids([pairs[i][1] for i in prompts])):
            encoded[i] = (ids, np.zeros_like(ids))
        for i, (src, record) in enumerate(pairs):
            if i not in encoded:
                encoded[i] = self.sft_ids(record)
        B, T = len(pairs), self.cfg.max_len
        batch = {"input_ids": np.full((B, T), self.pad, np.int32), "loss_mask": np.zeros((B, T), np.int32),
                 "lengths": np.zeros((B,), np.int32), "source": np.array([s for s, _ in pairs], np.int32),
                 "records": tuple(r for _, r in pairs)}
        for b, (_, record) in enumerate(pairs):
            ids, mask = self.fit(*encoded[b], record)
            batch["input_ids"][b, : len(ids)], batch["loss_mask"][b, : len(ids)] = ids, mask
            batch["lengths"][b] = len(ids)
        return batch

    def fit(self, ids: np.ndarray, mask: np.ndarray, record: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        T = self.cfg.max_len
        if len(ids) > T:
            if self.cfg.overflow == "error":
                raise DataError(f"record {record.get('id', '?')!r}: {len(ids)} tokens > max_len {T} "
                                "(raise max_len or set overflow: truncate)")
            ids, mask = ids[:T], mask[:T]
        return ids, mask


class EpochShuffle(grain.MapDataset):
    """Infinite repeat of `parent` with a fresh seeded permutation per epoch:
    element k is parent[perm_e[k mod N]], e = k div N, perm_e = permutation of N from PCG64 seeded by (seed, e).

    Grain's own `shuffle` uses a bijective index hash whose cost grows as the dataset shrinks (~1 ms per element
    at N = 100 here); one cached numpy permutation per epoch costs O(N) once and O(1) per element.
    """

    def __init__(self, parent: grain.MapDataset, seed: int):
        super().__init__(parent)
        self._seed, self._n = int(seed), len(parent)
        self._perms: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return sys.maxsize

    def __str__(self) -> str:
        return f"EpochShuffle(seed={self._seed}, n={self._n})"

    def _perm(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = np.random.default_rng([self._seed, epoch]).permutation(self._n)
            with self._lock:  # grain's read threads may cross an epoch boundary together
                if len(self._perms) >= 2:  # consumers move forward one epoch at a time
                    self._perms.pop(min(self._perms))
                self._perms[epoch] = perm
        return perm

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        epoch, k = divmod(index, self._n)
        return self._parent[int(self._perm(epoch)[k])]


def _process_split(process_index: int | None, process_count: int | None) -> tuple[int, int]:
    if process_index is None or process_count is None:
        import jax

        process_index, process_count = jax.process_index(), jax.process_count()
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index must be in [0, {process_count}), got {process_index}")
    return process_index, process_count


def mixed_records(
    cfg: PipelineConfig, records: Sequence[Sequence[dict[str, Any]]], *,
    process_index: int | None = None, process_count: int | None = None,
) -> grain.MapDataset:
    """The infinite, seeded mix of (source index, record) pairs for this process (before rendering)."""
    if len(records) != len(cfg.sources):
        raise ValueError(f"got record lists for {len(records)} sources, config has {len(cfg.sources)}")
    p, P = _process_split(process_index, process_count)
    parts = []
    for i, (src, recs) in enumerate(zip(cfg.sources, records)):
        share = grain.MapDataset.source(list(recs))[p::P]
        if len(share) == 0:
            raise DataError(f"source {src.name!r} ({src.path}): no records for process {p} of {P}")
        share = EpochShuffle(share, seed=(cfg.seed * 1_000_003 + i) % 2**32)
        parts.append(share.map(lambda r, i=i: (i, r)))
    return grain.MapDataset.mix(parts, weights=[s.weight for s in cfg.sources])


def build_dataset(
    cfg: PipelineConfig, tokenizer: Tokenizer, records: Sequence[Sequence[dict[str, Any]]] | None = None, *,
    process_index: int | None = None, process_count: int | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> grain.MapDataset:
    """Batches of rendered, tokenized examples as a MapDataset (records default to each source's file)."""
    if records is None:
        records, _ = load_sources(cfg)
    encoder = Encoder(tokenizer, cfg, tools)
    kinds = [s.kind for s in cfg.sources]
    mixed = mixed_records(cfg, records, process_index=process_index, process_count=process_count)
    pairs = mixed.batch(cfg.batch_size, drop_remainder=True, batch_fn=list)
    return pairs.map(lambda batch: encoder(batch, kinds))


def make_iterator(cfg: PipelineConfig, tokenizer: Tokenizer, records=None, **kwargs) -> grain.DatasetIterator:
    """A checkpointable iterator over `build_dataset` batches (grain get_state / set_state)."""
    ds = build_dataset(cfg, tokenizer, records, **kwargs).to_iter_dataset(
        grain.ReadOptions(num_threads=cfg.read_threads, prefetch_buffer_size=max(1, 2 * cfg.read_threads))
    )
    return iter(ds)
