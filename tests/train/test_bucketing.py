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


def _packed(sft_setup, pack_len=4096, bins=4, batch=4, **kw):
    from searchjax.data.packing import packed_dataset

    tok, cfg, records = sft_setup
    return packed_dataset(cfg, Encoder(tok, cfg), records, batch_size=batch, pack_len=pack_len, bins=bins,
                          **{"process_index": 0, "process_count": 1, **kw})


def test_packed_rows_hold_whole_examples_and_little_padding(sft_setup):
    """Every segment of a packed row is one example's own next-token arrays (its targets never cross into the
    next example), segments are numbered from 1 and packed from position 0, and padding is a small share."""
    from searchjax.data.packing import example_arrays

    tok, cfg, records = sft_setup
    enc = Encoder(tok, cfg)
    singles = {bytes(example_arrays(enc, r)["input_ids"]): example_arrays(enc, r) for r in records[0]}
    it = iter(_packed(sft_setup))
    real = total = 0
    for _ in range(6):
        b = next(it)
        assert b["input_ids"].shape == b["segments"].shape == (4, 4096)
        for row in range(4):
            seg, n = b["segments"][row], b["lengths"][row]
            assert (seg[:n] > 0).all() and (seg[n:] == 0).all() and (b["loss_mask"][row, n:] == 0).all()
            assert list(np.unique(seg[:n])) == list(range(1, seg.max() + 1))
            for s in range(1, seg.max() + 1):
                at = np.flatnonzero(seg == s)
                one = singles[bytes(b["input_ids"][row, at])]  # exactly one example, whole
                np.testing.assert_array_equal(b["targets"][row, at], one["targets"])
                np.testing.assert_array_equal(b["loss_mask"][row, at], one["loss_mask"])
        real, total = real + b["lengths"].sum(), total + b["input_ids"].size
    bucketed = [_batches(sft_setup, 16, (1024, 1536), 6)[1]]
    bucket_share = sum(x["lengths"].sum() for x in bucketed[0]) / sum(x["input_ids"].size for x in bucketed[0])
    assert real / total > max(0.8, bucket_share), (real / total, bucket_share)


def test_packed_stream_resumes_exactly_and_splits_over_processes(sft_setup):
    it = iter(_packed(sft_setup))
    first = [next(it) for _ in range(5)]
    it = iter(_packed(sft_setup))
    for _ in range(3):
        next(it)
    state = it.get_state()
    fresh = iter(_packed(sft_setup))
    fresh.set_state(state)
    for want in first[3:]:
        np.testing.assert_array_equal(next(fresh)["input_ids"], want["input_ids"])
    parts = [next(iter(_packed(sft_setup, process_index=p, process_count=2))) for p in (0, 1)]
    np.testing.assert_array_equal(np.concatenate([p["segments"] for p in parts]), first[0]["segments"])
    np.testing.assert_array_equal(np.concatenate([p["input_ids"] for p in parts]), first[0]["input_ids"])


def test_pack_len_shorter_than_max_len_is_refused(sft_setup):
    with pytest.raises(ValueError, match="pack_len 1024 is shorter than max_len 2048"):
        _packed(sft_setup, pack_len=1024)


def test_copy_rows_stay_below_the_special_tokens_and_copy_vocab(workspace):
    from searchjax.chat import QWEN35_SPECIAL_TOKENS
    from searchjax.train.lm import LMData, copy_id_limit

    tok = load_tokenizer(workspace["tokenizer"])
    first = min(tok.token_to_id(t) for t in QWEN35_SPECIAL_TOKENS if tok.token_to_id(t) is not None)
    assert copy_id_limit(tok) == first and copy_id_limit(tok, 64) == 64 and copy_id_limit(tok, 10**6) == first
    with pytest.raises(TypeError, match="copy_vocab"):
        LMData(copy_vocab=-1)
