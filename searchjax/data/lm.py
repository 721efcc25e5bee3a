"""Next-token pretraining data: documents → one token stream → fixed-length rows (no padding).

    stream = doc_1 ‖ <|endoftext|> ‖ doc_2 ‖ <|endoftext|> ‖ …          (documents in file order, tokenized once)
    row k  = stream[k·T : k·T + T + 1]                                   input_ids = row[:-1], targets = row[1:]

Rows are shuffled per epoch (searchjax.data.pipeline.EpochShuffle), split by process (row p, p+P, …) and batched;
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


def lm_dataset(rows: np.ndarray, batch_size: int, seed: int, *, process_index: int | None = None,
               process_count: int | None = None, shuffle: bool = True) -> grain.MapDataset:
    """Batches of this process's rows: infinite and shuffled per epoch (training), or one ordered pass
    (shuffle=False, evaluation; the last partial batch dropped)."""
    p, P = _process_split(process_index, process_count)
    share = grain.MapDataset.source(list(rows))[p::P]
    if len(share) < batch_size:
        raise DataError(f"{len(share)} rows for process {p} of {P}, fewer than one batch of {batch_size}")
    if shuffle:
        share = EpochShuffle(share, seed=seed)
    return share.batch(batch_size, drop_remainder=True, batch_fn=_batch)
