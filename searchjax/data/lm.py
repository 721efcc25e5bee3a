"""Next-token pretraining data: documents → one token stream → fixed-length rows (no padding).

    stream = doc_1 ‖ <|endoftext|> ‖ doc_2 ‖ <|endoftext|> ‖ …          (documents in file order, tokenized once)
    row k  = stream[k·T : k·T + T + 1]                                   input_ids = row[:-1], targets = row[1:]

Rows are shuffled per epoch (searchjax.data.pipeline.EpochShuffle) and batched; process p of P reads its slice of
each global batch, so the global batches do not depend on the process count;
every position is a real token (loss_mask all 1), documents are separated by the end-of-text token as in GPT-style
pretraining. The whole corpus is tokenized at start-up with the fast tokenizer's batch encoder: meant for corpora
of up to some hundred million tokens, as the offline world's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import grain
import numpy as np

from searchjax.chat import Tokenizer
from searchjax.chat.tokenizer import iter_corpus_texts
from searchjax.data.jsonl import DataError
from searchjax.data.pipeline import EpochShuffle, _process_split


def token_stream(paths: Sequence[str | os.PathLike], tokenizer: Tokenizer, batch: int = 1024) -> np.ndarray:
    """int32 ids of every document of `paths` (corpus JSONL: title + text; other files: lines), each followed by
    <|endoftext|>. Malformed JSONL rows raise with file:line (iter_corpus_texts)."""
    eos = tokenizer.special.endoftext
    pieces: list[np.ndarray] = []

    def flush(texts: list[str]) -> None:
        for ids in tokenizer.encode_batch(texts):
            pieces.append(np.asarray([*ids, eos], np.int32))

    texts: list[str] = []
    for text in iter_corpus_texts(paths):
        texts.append(text)
        if len(texts) == batch:
            flush(texts)
            texts = []
    if texts:
        flush(texts)
    if not pieces:
        raise DataError(f"{', '.join(map(str, paths))}: no documents")
    return np.concatenate(pieces)


def stream_rows(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """[R, T+1] rows of the stream (module docstring); the tail shorter than T+1 tokens is dropped."""
    n = (len(stream) - 1) // seq_len
    if n < 1:
        raise DataError(f"the corpus has {len(stream)} tokens, fewer than one row of seq_len + 1 = {seq_len + 1}")
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    return stream[idx]


def _batch(rows: Iterable[np.ndarray]) -> dict[str, np.ndarray]:
    x = np.stack(list(rows))
    return {"input_ids": x[:, :-1], "targets": x[:, 1:], "loss_mask": np.ones_like(x[:, 1:]),
            "lengths": np.full((len(x),), x.shape[1] - 1, np.int32)}


class ProcessRows(grain.MapDataset):
    """Element k = this process's rows of global batch k: parent[k·B + p·B/P + j] for j < B/P (it reads only
    those)."""

    def __init__(self, parent: grain.MapDataset, global_batch: int, process_index: int, process_count: int):
        super().__init__(parent)
        if global_batch % process_count:
            raise ValueError(f"batch_size {global_batch} is not a multiple of the {process_count} processes")
        self.b, self.local = global_batch, global_batch // process_count
        self.offset = process_index * self.local

    def __len__(self) -> int:
        return len(self._parent) // self.b

    def __str__(self) -> str:
        return f"ProcessRows(B={self.b}, rows {self.offset}..{self.offset + self.local})"

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        start = index * self.b + self.offset
        return _batch(self._parent[start + j] for j in range(self.local))


class CopyRows(grain.MapDataset):
    """Induction rows: element k is, with probability `fraction`, a row of T + 1 ids drawn uniformly from
    [0, high) in which a segment x of m ids appears twice, else parent[k] unchanged:

        row = noise ‖ x ‖ noise ‖ x ‖ noise,   m ~ U[⌈(T + 1)/8⌉, ⌊(T + 1)/2⌋],  the gap and the start uniform

    The second copy of x can only be predicted by finding the earlier occurrence of the current token and
    copying what followed it: the induction mechanism a policy needs to copy a name from its question or from a
    search result into a query or an answer. The length, the gap and the place of x change from row to row, so
    the distance between the copies does too: with a fixed distance (the first version: x ‖ x, m = (T + 1)/2)
    the science model learnt to copy from exactly that many positions back, a positional shortcut with no
    gain on any other distance and none on natural text (tools/copy_probe.py; RESULTS.md). Natural text rewards
    induction weakly once the corpus is memorised (a checkpoint pretrained on the world's corpus alone showed no
    copy gain). The ids are fresh for every element (a generator seeded by (seed, k)), so nothing can be
    memorised, and the rows are a pure function of k: resume stays exact. `high` is the first special-token id,
    so no row holds a chat-template token."""

    def __init__(self, parent: grain.MapDataset, fraction: float, seed: int, high: int):
        super().__init__(parent)
        if not 0 <= fraction <= 1 or high < 1:
            raise ValueError(f"CopyRows: 0 <= fraction <= 1 and high >= 1 required, got {fraction}, {high}")
        self._fraction, self._seed, self._high = float(fraction), int(seed), int(high)

    def __len__(self) -> int:
        return len(self._parent)

    def __str__(self) -> str:
        return f"CopyRows(fraction={self._fraction}, seed={self._seed})"

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        row = self._parent[index]
        rng = np.random.default_rng([self._seed, 0x1D, int(index)])
        if rng.random() >= self._fraction:
            return row
        return induction_row(rng, len(row), self._high).astype(row.dtype)


def induction_row(rng: np.random.Generator, n: int, high: int) -> np.ndarray:
    """n ids uniform in [0, high) with a segment of m ~ U[⌈n/8⌉, ⌊n/2⌋] ids repeated at a random later place
    (`CopyRows`)."""
    row = rng.integers(0, high, size=n)
    m = int(rng.integers(max(1, -(-n // 8)), max(1, n // 2) + 1))
    gap = int(rng.integers(0, n - 2 * m + 1))
    start = int(rng.integers(0, n - 2 * m - gap + 1))
    row[start + m + gap: start + 2 * m + gap] = row[start: start + m]
    return row


def lm_dataset(rows: np.ndarray, batch_size: int, seed: int, *, process_index: int | None = None,
               process_count: int | None = None, shuffle: bool = True, copy_fraction: float = 0.0,
               copy_high: int | None = None) -> grain.MapDataset:
    """This process's rows of the global batches (`batch_size` is the global batch): infinite and shuffled per
    epoch (training), or one ordered pass (shuffle=False, evaluation; the last partial batch dropped). The global
    batch k holds the same rows for any process count. `copy_fraction` > 0 replaces that share of the training
    rows by induction rows (`CopyRows`, ids below `copy_high`)."""
    p, n = _process_split(process_index, process_count)
    if len(rows) < batch_size:
        raise DataError(f"{len(rows)} rows, fewer than one batch of {batch_size}")
    source = grain.MapDataset.source(list(rows))
    if shuffle:
        source = EpochShuffle(source, seed=seed)
    if copy_fraction > 0:
        if copy_high is None:
            raise ValueError("lm_dataset: copy_fraction > 0 needs copy_high (the first special-token id)")
        source = CopyRows(source, copy_fraction, seed, copy_high)
    return ProcessRows(source, batch_size, p, n)
