"""Length-bucketed SFT batches and LM rows: shapes, shifts, padding share, determinism and exact resume."""

from __future__ import annotations

import numpy as np
import pytest

from searchjax.chat import load_tokenizer
from searchjax.data.bucketing import bucketed_dataset, pad_rows
from searchjax.data.jsonl import read_jsonl
from searchjax.data.lm import induction_row, lm_dataset, stream_rows, token_stream
from searchjax.data.pipeline import Encoder, PipelineConfig, SourceConfig


def test_pad_rows_shifts_targets_and_mask():
    out = pad_rows([(np.array([5, 6, 7]), np.array([0, 1, 1])), (np.array([8, 9]), np.array([0, 1]))], 4, pad_id=0)
    np.testing.assert_array_equal(out["input_ids"], [[5, 6, 7, 0], [8, 9, 0, 0]])
    np.testing.assert_array_equal(out["targets"], [[6, 7, 0, 0], [9, 0, 0, 0]])
    np.testing.assert_array_equal(out["loss_mask"], [[1, 1, 0, 0], [1, 0, 0, 0]])
    np.testing.assert_array_equal(out["lengths"], [3, 2])


@pytest.fixture(scope="module")
def sft_setup(workspace):
    tok = load_tokenizer(workspace["tokenizer"])
    cfg = PipelineConfig(sources=(SourceConfig("s", str(workspace["sft"]), "sft"),), seed=3, batch_size=4,
                         max_len=2048, overflow="truncate")
    records, _ = read_jsonl(workspace["sft"])
    return tok, cfg, [records]


def _batches(sft_setup, window, buckets, n):
    tok, cfg, records = sft_setup
    ds = bucketed_dataset(cfg, Encoder(tok, cfg), records, batch_size=4, window_batches=window, buckets=buckets,
                          process_index=0, process_count=1)
    return ds, [ds[i] for i in range(n)]


def test_buckets_and_less_padding_with_larger_windows(sft_setup):
    buckets = tuple(range(64, 2048, 32))  # fine buckets: the padded width follows each batch's longest row
    shares = {}
    for window in (1, 8):
        _, batches = _batches(sft_setup, window, buckets, 16)
        for b in batches:
            width = b["input_ids"].shape[1]
            assert width in (*buckets, 2048)
            assert b["lengths"].max() <= width
            smaller = [x for x in (*buckets, 2048) if x < width]
            assert not smaller or b["lengths"].max() > max(smaller)  # the smallest bucket that holds the batch
        shares[window] = sum(b["lengths"].sum() for b in batches) / sum(b["input_ids"].size for b in batches)
    assert shares[8] > shares[1], shares


def test_deterministic_and_resumes_exactly(sft_setup):
    ds, first = _batches(sft_setup, 4, (512, 1024), 12)
    _, again = _batches(sft_setup, 4, (512, 1024), 12)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
    it = iter(ds.to_iter_dataset())
    for _ in range(5):
        next(it)
    state = it.get_state()
    fresh = iter(ds.to_iter_dataset())
    fresh.set_state(state)
    np.testing.assert_array_equal(next(fresh)["input_ids"], first[5]["input_ids"])


def test_lm_rows_cover_the_stream_without_padding(workspace):
    tok = load_tokenizer(workspace["tokenizer"])
    stream = token_stream([workspace["corpus"]], tok)
    assert (stream == tok.special.endoftext).sum() > 10
    rows = stream_rows(stream, 32)
    np.testing.assert_array_equal(rows[1, :33], stream[32:65])
    np.testing.assert_array_equal(rows[0, -1], rows[1, 0])  # the target of the last position starts the next row
    batch = lm_dataset(rows, 4, seed=0, process_index=0, process_count=1)[0]
    np.testing.assert_array_equal(batch["targets"][:, :-1], batch["input_ids"][:, 1:])
    assert batch["loss_mask"].all() and batch["input_ids"].shape == (4, 32)
    parts = [lm_dataset(rows, 4, seed=0, process_index=p, process_count=2, shuffle=False)[0]["input_ids"]
             for p in (0, 1)]
    assert not set(map(bytes, parts[0])) & set(map(bytes, parts[1]))  # disjoint process shares


def longest_repeat(row: np.ndarray) -> tuple[int, int]:
    """(m, d): the longest run of positions with row[t] == row[t + d] over all d > 0 (the repeated segment)."""
    best = (0, 0)
    for d in range(1, len(row)):
        same = np.concatenate([[0], (row[d:] == row[:-d]).astype(int), [0]])
        edges = np.flatnonzero(np.diff(same))
        runs = edges[1::2] - edges[::2]
        if len(runs) and runs.max() > best[0]:
            best = (int(runs.max()), d)
    return best


def test_induction_row_repeats_one_segment_at_a_random_distance():
    rng = np.random.default_rng(0)
    for n in (2, 9, 129, 513):
        row = induction_row(rng, n, 50_000)  # ids from a large range: chance repeats are rare
        m, d = longest_repeat(row)
        assert -(-n // 8) <= m <= n // 2 and d >= m and row.max() < 50_000 and len(row) == n


def test_copy_rows_repeat_fresh_random_ids_deterministically():
    rows = np.arange(200 * 33, dtype=np.int32).reshape(200, 33) % 500 + 600  # ids >= 600: never drawn by CopyRows
    ds = lm_dataset(rows, 8, seed=3, process_index=0, process_count=1, copy_fraction=0.25, copy_high=500)
    batches = [ds[k] for k in range(20)]
    x = np.concatenate([np.concatenate([b["input_ids"], b["targets"][:, -1:]], axis=1) for b in batches])
    copied = x.max(axis=1) < 500
    assert 0.15 < copied.mean() < 0.35  # ~copy_fraction of the rows
    distances = set()
    for row in x[copied]:
        m, shift = longest_repeat(row)
        assert 5 <= m <= 16  # a segment of m ∈ [⌈33/8⌉, ⌊33/2⌋] ids appears twice
        distances.add(shift)
    assert len(distances) > 5  # the copies lie at different distances (no positional shortcut)
    assert len({bytes(r) for r in x[copied]}) == copied.sum()  # fresh ids every time
    assert (x[~copied] >= 600).all()  # the other rows are the corpus rows, unchanged
    again = lm_dataset(rows, 8, seed=3, process_index=0, process_count=1, copy_fraction=0.25, copy_high=500)
    np.testing.assert_array_equal(again[7]["input_ids"], batches[7]["input_ids"])  # a function of the index
    with pytest.raises(ValueError, match="needs copy_high"):
        lm_dataset(rows, 8, seed=3, copy_fraction=0.5)
