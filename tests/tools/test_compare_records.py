"""tools/compare_records.py: paired counts, the McNemar p and the per-hop split of two eval_sft records files."""

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "tools" / "compare_records.py"
_spec = importlib.util.spec_from_file_location("compare_records", _PATH)
compare_records = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare_records)


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _rec(qid, correct, calls, hops):
    return {"id": qid, "correct": correct, "tool_calls": calls, "hops": hops, "finish_reason": "answer"}


def test_paired_counts_p_and_hops(tmp_path, capsys):
    # q0..q3 both right or wrong in known ways; 2-hop: A wins one; 4-hop: B wins three.
    a = [_rec("q0", True, 2, 2), _rec("q1", True, 3, 2), _rec("q2", False, 4, 4), _rec("q3", False, 4, 4),
         _rec("q4", False, 4, 4), _rec("q5", False, 1, 2)]
    b = [_rec("q5", False, 1, 2), _rec("q4", True, 2, 4), _rec("q3", True, 2, 4), _rec("q2", True, 2, 4),
         _rec("q1", False, 2, 2), _rec("q0", True, 1, 2)]
    out = tmp_path / "cmp.json"
    assert compare_records.main(["--a", _write(tmp_path / "a.jsonl", a), "--b", _write(tmp_path / "b.jsonl", b),
                                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report == json.loads(capsys.readouterr().out)
    assert (report["n"], report["both"], report["a_only"], report["b_only"], report["neither"]) == (6, 1, 1, 3, 1)
    assert (report["a_correct"], report["b_correct"]) == (2, 4)
    assert report["a_calls"] == pytest.approx(18 / 6) and report["b_calls"] == pytest.approx(10 / 6)
    assert report["mcnemar_p"] == pytest.approx(2 * 5 / 16)  # 2 · P(Bin(4, ½) ≤ 1)
    two, four = report["by_hops"]["2"], report["by_hops"]["4"]
    assert (two["n"], two["a_only"], two["b_only"]) == (3, 1, 0)
    assert (four["n"], four["a_only"], four["b_only"], four["mcnemar_p"]) == (3, 0, 3, pytest.approx(0.25))


def test_bad_inputs_name_the_problem(tmp_path):
    good = _write(tmp_path / "good.jsonl", [_rec("q0", True, 1, 2)])
    other = _write(tmp_path / "other.jsonl", [_rec("q9", True, 1, 2)])
    with pytest.raises(SystemExit, match="different questions: 1 only in --a .*q0"):
        compare_records.main(["--a", good, "--b", other])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_rec("q0", True, 1, 2)) + "\n" + json.dumps({"id": "q1", "correct": True}) + "\n")
    with pytest.raises(SystemExit, match=r"bad.jsonl:2: missing field\(s\) \['tool_calls'\]"):
        compare_records.main(["--a", str(bad), "--b", good])
    twice = _write(tmp_path / "twice.jsonl", [_rec("q0", True, 1, 2), _rec("q0", False, 1, 2)])
    with pytest.raises(SystemExit, match="'q0' appears twice"):
        compare_records.main(["--a", twice, "--b", good])


def _search(query):
    return {"name": "search_web", "arguments": {"query": query}, "ok": True, "error": None}


def test_repeated_searches_per_question_and_per_outcome(tmp_path):
    # A: q0 right with one repeat (" Kystou " == "kystou" after trim + casefold), q1 wrong with none;
    # B: q0 right with two repeats, q1 wrong with one; a malformed call (no query) is not a search.
    a = [{**_rec("q0", True, 3, 2), "turns": [{"tool_calls": [_search("kystou")]},
                                              {"tool_calls": [_search(" Kystou "), _search("founder")]}]},
         {**_rec("q1", False, 1, 2), "turns": [{"tool_calls": [_search("x"), {"name": "search_web",
                                                                               "arguments": "bad"}]}]}]
    b = [{**_rec("q0", True, 3, 2), "turns": [{"tool_calls": [_search("k"), _search("k"), _search("k")]}]},
         {**_rec("q1", False, 2, 2), "turns": [{"tool_calls": [_search("y")]}, {"tool_calls": [_search("Y")]},
                                               {"tool_calls": []}]}]
    report = compare_records.compare(compare_records.load(_write(tmp_path / "a.jsonl", a)),
                                     compare_records.load(_write(tmp_path / "b.jsonl", b)))
    assert (report["a_repeats"], report["a_repeats_right"], report["a_repeats_wrong"]) == (0.5, 1.0, 0.0)
    assert (report["b_repeats"], report["b_repeats_right"], report["b_repeats_wrong"]) == (1.5, 2.0, 1.0)
    assert report["by_hops"]["2"]["b_repeats"] == 1.5
    # records without their turns: no repeat fields (and no guess)
    plain = compare_records.compare({"q0": _rec("q0", True, 1, 2)}, {"q0": _rec("q0", True, 1, 2)})
    assert not [k for k in plain if "repeats" in k]
