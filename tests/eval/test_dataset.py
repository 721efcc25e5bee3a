"""Question files: a bad row is an error naming file:line; benchmarks by NAME=FILE; unanswerable and languages."""

import json

import pytest

from searchjax.data.jsonl import DataError
from searchjax.eval.dataset import load_benchmark, load_questions, parse_benchmark


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows))
    return path


GOOD = {"id": "q1", "question": "Who?", "answer": "Ada", "aliases": ["A. L."], "hops": 2}


@pytest.mark.parametrize("bad, reason", [
    ("{not json", "invalid JSON"),
    ({"id": "q2", "question": "Who?"}, "missing field 'answer'"),
    ({"id": "q2", "question": "", "answer": "x"}, "'question' is empty"),
    ({"id": "q1", "question": "Again?", "answer": "x"}, "duplicate id 'q1'"),
    ({"id": "q2", "question": "Who?", "answer": "x", "aliases": "y"}, "'aliases'"),
    ({"id": "q2", "question": "Who?", "answer": "x", "language": "xx"}, "'language'"),
    ({"id": "q2", "question": "Who?", "answer": ""}, "answerable: false"),
])
def test_a_bad_row_names_file_and_line(tmp_path, bad, reason):
    path = _write(tmp_path / "qa.jsonl", [GOOD, bad])
    with pytest.raises(DataError, match=rf"qa.jsonl:2: .*{reason}"):
        load_questions(path)


def test_questions_with_languages_and_unanswerable_rows(tmp_path):
    rows = [GOOD, {"id": "q1-sv", "question": "Vem?", "answer": "Ada", "language": "sv", "chain": []},
            {"id": "q1-none", "question": "Who?", "answer": "", "answerable": False}]
    q = load_questions(_write(tmp_path / "qa.jsonl", rows))
    assert [(x.id, x.aliases, x.language, x.answerable, x.grading) for x in q] == [
        ("q1", ("Ada", "A. L."), "en", True, "short"), ("q1-sv", ("Ada",), "sv", True, "short"),
        ("q1-none", (), "en", False, "short")]
    with pytest.raises(DataError, match="no questions"):
        load_questions(_write(tmp_path / "empty.jsonl", []))


def test_benchmarks_by_name_and_file(tmp_path):
    csv_path = tmp_path / "simple_qa_test_set.csv"
    csv_path.write_text('metadata,problem,answer\n"{\'topic\': \'Art\'}",Who painted it?,Ada\n')
    name, path = parse_benchmark(f"simpleqa={csv_path}")
    (q,) = load_benchmark(name, path)
    assert (q.question, q.aliases, q.source, q.grading) == ("Who painted it?", ("Ada",), "simpleqa", "simpleqa")
    tsv = tmp_path / "frames.tsv"
    tsv.write_text("Prompt\tAnswer\twiki_links\nHow many?\t3\t['https://w/x']\n")
    assert load_benchmark("frames", tsv)[0].grading == "frames"
    for spec, match in (("simpleqa", "NAME=FILE"), ("trivia=x.csv", "unknown benchmark 'trivia'")):
        with pytest.raises(ValueError, match=match):
            parse_benchmark(spec)
    csv_path.write_text("metadata,problem,answer\nnot a dict,Who?,Ada\n")
    with pytest.raises(DataError, match=r"simple_qa_test_set.csv:2"):
        load_benchmark("simpleqa", csv_path)
