"""Packed SFT batches: several examples per row, so padding is a small share of the trained tokens.

    examples = mix(sources)                                     (searchjax.data.pipeline.mixed_records)
    each example rendered, tokenized and cut to max_len, as next-token arrays of its own length
    rows     = grain's first-fit packing (grain.experimental.FirstFitPackIterDataset) of the stream into rows of
               `pack_len` tokens, `bins` rows at a time (an example goes into the first row with room; when one
               fits none, the rows are emitted and a new set starts with it)
    batches  = consecutive rows, B at a time

Why packing and not only length buckets (searchjax.data.bucketing): the science SFT examples are ~890-1,730
tokens (median ~1,240 with 3 results per search), so a bucketed batch is padded to the next bucket (0.79 of its
tokens real at batch 4 with buckets 1,024 / 1,536 / 2,048) and two examples rarely fit one 2,048-token row.
Rows of 4,096 tokens hold about three: 0.90-0.93 real tokens with 4-16 bins (first-fit over that length
distribution). One shape for the whole run, so one compilation.

Each example keeps its own next-token arrays (its targets are its own tokens shifted, the last one a pad, so no
target crosses into the next example), and the model sees the rows as separate sequences through `segments`
(`searchjax.model.transformer.hidden_states`: attention masked by segment, DeltaNet restarted, positions from 0).
Outputs per batch, every array [B, pack_len] except lengths [B]:

    input_ids, targets, loss_mask   the packed examples' arrays (pad id / 0 after the last example)
    segments                        1, 2, … for the examples of a row, 0 on its padding
    lengths                         real tokens of the row (the examples are packed from position 0)

The stream is a grain iterator whose state grain checkpoints (the packer's own state included), so a resumed
run continues with the same rows. Every process packs the same global stream and keeps its rows of each batch
(as the bucketed batches do), so a multi-process run trains on exactly the batches of a one-process run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grain
import grain.experimental as grain_experimental
import numpy as np

from searchjax.data.bucketing import pad_rows, take_rows
from searchjax.data.pipeline import Encoder, PipelineConfig, _process_split, mixed_records

PACKED_KEYS = ("input_ids", "targets", "loss_mask")


def example_arrays(encoder: Encoder, record: dict[str, Any]) -> dict[str, np.ndarray]:
    """One SFT example's next-token arrays (input_ids, targets, loss_mask), as long as the example (≤ max_len)."""
    ids, mask = encoder.fit(*encoder.sft_ids(record), record)
    row = pad_rows([(ids, mask)], len(ids), encoder.pad)
    return {k: row[k][0] for k in PACKED_KEYS}


def packed_batch(rows: dict[str, np.ndarray], pad_id: int) -> dict[str, np.ndarray]:
    """The batch of the module docstring from B stacked packer outputs."""
    seg = rows["input_ids_segment_ids"].astype(np.int32)
    real = seg > 0
    return {"input_ids": np.where(real, rows["input_ids"], pad_id).astype(np.int32),
            "targets": np.where(real, rows["targets"], pad_id).astype(np.int32),
            "loss_mask": np.where(real, rows["loss_mask"], 0).astype(np.int32),
            "segments": seg, "lengths": real.sum(axis=1).astype(np.int32)}


def packed_dataset(cfg: PipelineConfig, encoder: Encoder, records: Sequence[Sequence[dict[str, Any]]], *,
                   batch_size: int, pack_len: int, bins: int, process_index: int | None = None,
                   process_count: int | None = None) -> grain.IterDataset:
    """This process's rows of the global packed SFT batches (`batch_size` global rows per batch; module
    docstring). Examples longer than max_len follow the config's `overflow` rule first."""
    if pack_len < cfg.max_len:
        raise ValueError(f"pack_len {pack_len} is shorter than max_len {cfg.max_len}: an example of max_len tokens "
                         "would fit no row")
    if bins < 1 or batch_size < 1:
        raise ValueError(f"bins and batch_size must be >= 1, got {bins}, {batch_size}")
    p, n = _process_split(process_index, process_count)
    mixed = mixed_records(cfg, records, process_index=0, process_count=1)
    examples = mixed.map(lambda pair: example_arrays(encoder, pair[1])).to_iter_dataset()
    packed = grain_experimental.FirstFitPackIterDataset(
        examples, length_struct={k: pack_len for k in PACKED_KEYS}, num_packing_bins=bins, seed=cfg.seed,
        shuffle_bins=True)
    batches = packed.batch(batch_size, drop_remainder=True).map(lambda rows: packed_batch(rows, encoder.pad))
    return batches if n == 1 else batches.map(lambda b: take_rows(b, p, n))
