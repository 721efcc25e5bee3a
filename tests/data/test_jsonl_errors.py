"""read_jsonl: undecodable lines and unreadable paths are DataErrors naming file and line, or counted skips."""

from __future__ import annotations

import pytest

from searchjax.data.jsonl import DataError, read_jsonl


def test_a_bad_byte_is_that_line_s_error(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": "\xff"}\n{"a": 3}\n')
    with pytest.raises(DataError, match=rf"{path}:2: .*can't decode byte 0xff"):
        read_jsonl(path)
    rows, summary = read_jsonl(path, on_error="skip")
    assert [r["a"] for r in rows] == [1, 3] and summary.kept == 2
    assert len(summary.skipped) == 1 and summary.skipped[0].startswith(f"{path}:2: ")


def test_unreadable_paths(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        read_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(DataError, match="is a directory"):
        read_jsonl(tmp_path)


def test_write_jsonl_is_atomic(tmp_path):
    from searchjax.data.jsonl import write_jsonl

    out = tmp_path / "qa.jsonl"
    assert write_jsonl(out, [{"a": i} for i in range(10)]) == 10

    def dies_midway():
        for i in range(297):
            yield {"partial": i}
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        write_jsonl(out, dies_midway())
    assert [r["a"] for r in read_jsonl(out)[0]] == list(range(10))
    assert [p.name for p in tmp_path.iterdir()] == ["qa.jsonl"]


def test_check_fields_names_only_what_differs():
    from searchjax.data.jsonl import check_fields

    check_fields({"id": 1, "q": 2}, ["id", "q"])
    with pytest.raises(ValueError, match=r"^missing field 'id'$"):
        check_fields({"q": 2}, ["id", "q"])
    with pytest.raises(ValueError, match=r"^missing fields 'id', 'q'; unexpected field 'x'$"):
        check_fields({"x": 2}, ["id", "q"])
    check_fields({"id": 1, "q": 2, "x": 3}, ["id"], exact=False)
