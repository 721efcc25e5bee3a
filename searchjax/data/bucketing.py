"""Length-bucketed SFT batches: few distinct shapes (each compiles once) and little padding.

    examples = mix(sources)                                   (searchjax.data.pipeline.mixed_records)
    window w = examples[w·W·B : (w+1)·W·B], each rendered + tokenized
    batches  = the window sorted by length, cut into W runs of B rows, each padded to the smallest bucket that holds
               its longest row; the W batches of a window are emitted in a seeded random order

Sorting inside a window of W·B examples (W = `window_batches`) puts examples of similar length together, so the
padded share of a batch falls roughly as 1/W, while the data order stays a pure function of (records, seed): the
dataset is a random-access grain `MapDataset` whose iterator state is one index, as the other pipelines.
Bucket lengths are config (e.g. 256, 512, 1024, 2048); a row longer than the largest bucket follows the config's
`overflow` rule (error, or truncate). Outputs per batch, right-padded with the tokenizer's pad id:

    input_ids [B, T]   the tokens
    targets   [B, T]   input_ids shifted left by one (the next token; pad at the end)
    loss_mask [B, T]   1 where targets[t] is an assistant token (the mask of encode_conversation, shifted alike)
    lengths   [B], source [B], records (the B source records)
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from searchjax.data.pipeline import Encoder, PipelineConfig, _process_split, mixed_records


def pad_rows(rows: Sequence[tuple[np.ndarray, np.ndarray]], width: int, pad_id: int) -> dict[str, np.ndarray]:
    """Right-padded next-token arrays (module docstring) of (ids, mask) rows, each at most `width` long."""
    b = len(rows)
    ids = np.full((b, width), pad_id, np.int32)
    mask = np.zeros((b, width), np.int32)
    lengths = np.zeros((b,), np.int32)
    for i, (x, m) in enumerate(rows):
        ids[i, : len(x)], mask[i, : len(x)], lengths[i] = x, m, len(x)
    targets = np.full_like(ids, pad_id)
    targets[:, :-1] = ids[:, 1:]
    loss_mask = np.zeros_like(mask)
    loss_mask[:, :-1] = mask[:, 1:]
    return {"input_ids": ids, "targets": targets, "loss_mask": loss_mask, "lengths": lengths}


class BucketedBatches(grain.MapDataset):
    """Batch k = batch (k mod W) of window k div W (module docstring); infinite like its parent."""

    def __init__(self, parent: grain.MapDataset, encoder: Encoder, batch_size: int, window_batches: int,
                 buckets: Sequence[int], seed: int):
        super().__init__(parent)
        if window_batches < 1 or batch_size < 1:
            raise ValueError(f"batch_size and window_batches must be >= 1, got {batch_size}, {window_batches}")
        self.encoder, self.b, self.w = encoder, batch_size, window_batches
        self.buckets = sorted(int(x) for x in buckets)
        self.seed = int(seed)
        self._cache: dict[int, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._parent) // (self.b * self.w) * self.w

    def __str__(self) -> str:
        return f"BucketedBatches(B={self.b}, W={self.w}, buckets={self.buckets})"

    def _bucket(self, length: int) -> int:
        return self.buckets[min(bisect.bisect_left(self.buckets, length), len(self.buckets) - 1)]

    def _window(self, w: int) -> list[dict[str, Any]]:
        with self._lock:
            if w in self._cache:
                return self._cache[w]
        n = self.b * self.w
        pairs = [self._parent[w * n + i] for i in range(n)]
        encoded = [self.encoder.fit(*self.encoder.sft_ids(record), record) for _, record in pairs]
        order = sorted(range(n), key=lambda i: len(encoded[i][0]))
        batches = []
        for j in range(self.w):
            idx = order[j * self.b: (j + 1) * self.b]
            width = self._bucket(max(len(encoded[i][0]) for i in idx))
            batch = pad_rows([encoded[i] for i in idx], width, self.encoder.pad)
            batch["source"] = np.array([pairs[i][0] for i in idx], np.int32)
            batch["records"] = tuple(pairs[i][1] for i in idx)
            batches.append(batch)
        perm = np.random.default_rng([self.seed, w]).permutation(self.w)
        batches = [batches[p] for p in perm]
        with self._lock:
            if len(self._cache) >= 2:  # consumers move forward one window at a time
                self._cache.pop(min(self._cache))
            self._cache[w] = batches
        return batches

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        w, j = divmod(index, self.w)
        return self._window(w)[j]


def take_rows(batch: dict[str, Any], process_index: int, process_count: int) -> dict[str, Any]:
    """Process p's rows [p·B/P, (p+1)·B/P) of a global batch (every array and the records)."""
    b = len(batch["records"]) if "records" in batch else len(batch["input_ids"])
    if b % process_count:
        raise ValueError(f"a global batch of {b} rows does not split over {process_count} processes")
    lo, hi = process_index * b // process_count, (process_index + 1) * b // process_count
    return {k: v[lo:hi] for k, v in batch.items()}


def bucketed_dataset(cfg: PipelineConfig, encoder: Encoder, records: Sequence[Sequence[dict[str, Any]]], *,
                     batch_size: int, window_batches: int, buckets: Sequence[int],
                     process_index: int | None = None, process_count: int | None = None) -> grain.MapDataset:
    """This process's rows of the global bucketed SFT batches (`batch_size` is the global batch).

    Every process lays out the same global batches (the window's sort needs every example's length) and keeps
    its rows of each, so batch k holds the same examples, at the same padded width, for any process count: a
    2-process run trains on exactly the batches of a 1-process run.
    """
    too_long = [b for b in buckets if b > cfg.max_len]
    if too_long or not buckets:
        raise ValueError(f"buckets {list(buckets)} must be non-empty and <= max_len {cfg.max_len}")
    p, n = _process_split(process_index, process_count)
    mixed = mixed_records(cfg, records, process_index=0, process_count=1)
    widths = sorted(set(buckets) | {cfg.max_len})  # every row fits the largest bucket after the overflow rule
    batches = BucketedBatches(mixed, encoder, batch_size, window_batches, widths, cfg.seed)
    return batches if n == 1 else batches.map(lambda b: take_rows(b, p, n))
