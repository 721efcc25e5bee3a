"""summary.csv (columns, one row per model × budget, Wilson intervals), the internal metrics and the figures."""

import csv
import io
import math

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from searchjax.eval.calls import CATEGORIES
from searchjax.eval.cost import ModelPrice
from searchjax.eval.plots import COLORS, cost_accuracy_figure, tool_efficiency_figure, write_figures
from searchjax.eval.summary import (CSV_COLUMNS, internal_metrics, mcnemar_exact, summary_csv, summary_rows,
                                    wilson_interval)

PRICE = ModelPrice(input=1.0, output=4.0)


def _row(model, budget, correct, *, qid="q", sample=0, answerable=True, abstained=False, calls=0, broken=None,
         qlang="en", alang="en", p=0.99, grade=None):
    return {"model": model, "question_id": qid, "budget": budget, "sample": sample, "answer": "a",
            "correct": correct, "grade": grade or ("CORRECT" if correct else "INCORRECT"), "tool_calls": calls,
            "failed_calls": 0, "tokens_in": 1000, "tokens_out": 100, "finish_reason": "answer", "cached_in": 0,
            "em": correct, "f1": 1.0 * correct, "answerable": answerable, "abstained": abstained,
            "question_language": qlang, "answer_language": alang, "answer_language_p": p,
            "broken_calls": {c: (broken or {}).get(c, 0) for c in CATEGORIES}, "search_errors": 0}


def test_wilson_interval_matches_the_closed_form():
    lo, hi = wilson_interval(8, 10)
    assert (lo, hi) == pytest.approx((0.4902, 0.9433), abs=1e-4)  # the textbook 95% Wilson interval of 8/10
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == 1.0
    for n in range(1, 201):  # exact ends, not an ulp off (0/40 gave 5.6e-17 before)
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_mcnemar_exact_matches_the_binomial_tail():
    # 6 vs 8 discordant: 2 · P(Bin(14, ½) ≤ 6) = 2 · 6476 / 16384
    assert mcnemar_exact(6, 8) == pytest.approx(2 * 6476 / 2 ** 14)
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32) and mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(7, 7) == 1.0
    for a in range(12):
        for b in range(12):
            p = mcnemar_exact(a, b)
            assert 0 < p <= 1 and p == mcnemar_exact(b, a)
            if a < b:  # one more discordant question for the side already ahead: stronger evidence
                assert mcnemar_exact(a, b + 1) < p
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_summary_csv_has_the_columns_and_one_row_per_model_and_budget():
    rows = [_row("sft", b, k % 2 == 0, qid=f"q{k}") for b in (0, 1) for k in range(4)]
    rows += [_row("base", 0, False, qid="q0"), _row("base", 0, True, qid="nope", answerable=False)]
    summary = summary_rows(rows, {"sft": PRICE, "base": PRICE}, ["sft", "base"], [0, 1])
    parsed = list(csv.DictReader(io.StringIO(summary_csv(summary))))
    assert tuple(parsed[0]) == CSV_COLUMNS
    assert [(r["model"], r["budget"]) for r in parsed] == [("sft", "0"), ("sft", "1"), ("base", "0"), ("base", "1")]
    sft0 = parsed[0]
    assert sft0["n"] == "4" and float(sft0["accuracy"]) == 0.5
    assert float(sft0["cents_per_query"]) == pytest.approx(100 * (1000 * 1.0 + 100 * 4.0) / 1e6)
    assert sft0["cents_per_query_cached"] == ""  # the price lists no cached rate
    assert parsed[2]["n"] == "1"  # the unanswerable question is not in the accuracy
    assert parsed[3]["n"] == "0" and parsed[3]["accuracy"] == ""  # no trajectories: empty cells


def test_internal_metrics():
    rows = [
        _row("m", 2, False, qid="u1", answerable=False, abstained=True, grade="NOT_ATTEMPTED"),
        _row("m", 2, False, qid="u2", answerable=False, abstained=False),
        _row("m", 2, False, qid="a1", abstained=True, grade="NOT_ATTEMPTED", qlang="sv", alang="en", calls=3,
             broken={"over_budget": 2}),
        _row("m", 2, True, qid="a2", qlang="ja", alang="ja", calls=1),
        _row("m", 2, True, qid="a3", qlang="sv", alang="und", p=0.0),
        _row("m", 2, False, qid="a4", qlang="en", alang="de", p=0.3, broken={"parse": 1}, calls=1),
    ]
    (m,) = internal_metrics(rows, ["m"], [2], min_confidence=0.5)
    assert m["abstained_when_unanswerable"] == 0.5 and m["abstained_when_answerable"] == 0.25
    # decided: u1, u2 (en, p .99), a1 (sv question, English answer), a2 (ja = ja): one mismatch in four
    assert m["language_mismatch"] == 0.25 and m["language_undetermined"] == pytest.approx(2 / 6)
    assert m["broken_per_question"] == pytest.approx(3 / 6) and m["broken_per_call"] == pytest.approx(3 / 5)
    assert m["broken_over_budget"] == 2 and m["broken_parse"] == 1
    # answerable grades: NOT_ATTEMPTED, CORRECT, CORRECT, INCORRECT -> C/N = 1/2, C/(C+I) = 2/3
    assert m["simpleqa_f_score"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    (empty,) = internal_metrics([], ["m"], [0], 0.5)
    assert math.isnan(empty["language_mismatch"]) and math.isnan(empty["broken_per_call"])


def _summary(models=("sft", "base", "third")):
    rows = [_row(m, b, (k + b + i) % 3 != 0, qid=f"q{k}") for i, m in enumerate(models) for b in range(4)
            for k in range(6)]
    return summary_rows(rows, {m: PRICE for m in models}, list(models), list(range(4)))


def test_figures_hold_one_line_per_model():
    models = ["sft", "base", "third"]
    summary = _summary(models)
    for fig in (tool_efficiency_figure(summary, models), cost_accuracy_figure(summary, models)):
        (ax,) = fig.axes
        assert [line.get_label() for line in ax.get_lines()] == models
        assert all(len(line.get_xdata()) == 4 for line in ax.get_lines())
        assert [t.get_text() for t in ax.get_legend().get_texts()] == models


def test_written_pngs_show_every_model_line(tmp_path):
    models = ["sft", "base"]
    write_figures(_summary(models), models, tmp_path)
    for name in ("tool_efficiency.png", "cost_accuracy.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = imread(tmp_path / name)[..., :3]
        for color in COLORS[: len(models)]:  # each model's line colour is drawn
            assert (np.abs(pixels - np.asarray(to_rgb(color))).max(axis=-1) < 0.02).sum() > 50, (name, color)
        assert (np.abs(pixels - np.asarray(to_rgb(COLORS[2]))).max(axis=-1) < 0.02).sum() == 0  # no third line
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind
