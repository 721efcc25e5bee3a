"""From results.jsonl lines to summary.csv, the write-up's internal metrics and summary.md.

summary.csv has one row per model × budget over the answerable questions' trajectories:
  model, budget, n, accuracy, accuracy_lo, accuracy_hi (the 95% Wilson interval of the accuracy over the n
  trajectories), mean_tool_calls, broken_tool_calls (broken calls per trajectory), tokens_in, tokens_out (mean
  billed tokens per query, searchjax.eval.cost), cents_per_query (list prices, no caching) and
  cents_per_query_cached (with the table's cached-input rate; empty when it has none).

Internal metrics (RECIPE.md §5), per model × budget:
  abstention       on unanswerable questions the share answered with an abstention (↑), on answerable ones the
                   share wrongly abstained (↓);
  language         among answers whose language is identified with probability ≥ min_confidence, the share whose
                   language differs from the question's (↓); the share left undetermined (e.g. a bare entity
                   name, which has no language) is reported beside it;
  broken calls     broken calls per question and per call, and their split by category (searchjax.eval.calls);
  SimpleQA         the F-score of the SimpleQA-style grades (searchjax.eval.graders.simpleqa_f_score);
  preference       mean P̄ against a baseline model over shared trajectories (searchjax.eval.preference).
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from searchjax.eval.calls import CATEGORIES
from searchjax.eval.cost import ModelPrice, cents
from searchjax.eval.graders import GRADES, simpleqa_f_score

CSV_COLUMNS = ("model", "budget", "n", "accuracy", "accuracy_lo", "accuracy_hi", "mean_tool_calls",
               "broken_tool_calls", "tokens_in", "tokens_out", "cents_per_query", "cents_per_query_cached")
Z95 = 1.959963984540054


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion k/n:

        centre = (p̂ + z²/2n) / (1 + z²/n),  half = z √(p̂(1−p̂)/n + z²/4n²) / (1 + z²/n).

    At k = 0 the lower end is exactly 0 and at k = n the upper end exactly 1 (centre ∓ half is 0 or 1 in exact
    arithmetic; in floating point it can miss by an ulp, e.g. 5.6e-17 for 0/40).
    """
    if not 0 <= k <= n or n == 0:
        raise ValueError(f"wilson_interval: need 0 <= k <= n and n > 0, got k={k}, n={n}")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return lo, hi


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """The exact two-sided McNemar test of two models graded on the same questions: under H0 (equal accuracy) each
    discordant question (right for one model only) is A's with probability ½, so with n = a_only + b_only

        p = min(1, 2 · P(X ≤ min(a_only, b_only))),  X ~ Binomial(n, ½);   p = 1 when n = 0.

    The questions both models get right or both get wrong carry no information about which is better.
    """
    if a_only < 0 or b_only < 0:
        raise ValueError(f"mcnemar_exact: counts must be >= 0, got {a_only}, {b_only}")
    n = a_only + b_only
    tail = sum(math.comb(n, k) for k in range(min(a_only, b_only) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def _groups(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["model"], r["budget"])].append(r)
    return groups


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _broken(row: dict[str, Any]) -> int:
    return sum(row["broken_calls"].values())


def summary_rows(rows: Sequence[dict[str, Any]], prices: dict[str, ModelPrice], models: Sequence[str],
                 budgets: Sequence[int]) -> list[dict[str, Any]]:
    """One summary.csv row per model × budget (module docstring); `prices` maps each model label to its price."""
    groups = _groups(r for r in rows if r["answerable"])
    out = []
    for model in models:
        price = prices[model]
        for b in budgets:
            g = groups.get((model, b), [])
            n, k = len(g), sum(r["correct"] for r in g)
            lo, hi = wilson_interval(k, n) if n else (math.nan, math.nan)
            cached = (_mean([cents(r["tokens_in"], r["tokens_out"], price, r["cached_in"]) for r in g])
                      if price.cached_input is not None else None)
            out.append({
                "model": model, "budget": b, "n": n, "accuracy": k / n if n else math.nan, "accuracy_lo": lo,
                "accuracy_hi": hi, "mean_tool_calls": _mean([r["tool_calls"] for r in g]),
                "broken_tool_calls": _mean([_broken(r) for r in g]),
                "tokens_in": _mean([r["tokens_in"] for r in g]), "tokens_out": _mean([r["tokens_out"] for r in g]),
                "cents_per_query": _mean([cents(r["tokens_in"], r["tokens_out"], price) for r in g]),
                "cents_per_query_cached": cached,
            })
    return out


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def summary_csv(summary: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in summary:
        writer.writerow([_cell(row[c]) for c in CSV_COLUMNS])
    return buf.getvalue()


def internal_metrics(rows: Sequence[dict[str, Any]], models: Sequence[str], budgets: Sequence[int],
                     min_confidence: float) -> list[dict[str, Any]]:
    """The internal metrics of the module docstring, one dict per model × budget (NaN where undefined)."""
    groups = _groups(rows)
    out = []
    for model in models:
        for b in budgets:
            g = groups.get((model, b), [])
            answerable = [r for r in g if r["answerable"]]
            unanswerable = [r for r in g if not r["answerable"]]
            decided = [r for r in g if r["answer_language"] != "und" and r["answer_language_p"] >= min_confidence]
            calls = sum(r["tool_calls"] for r in g)
            broken = sum(_broken(r) for r in g)
            grades = [r["grade"] for r in answerable if r["grade"] in GRADES]
            f = simpleqa_f_score(grades) if grades else {}
            out.append({
                "model": model, "budget": b, "n": len(g),
                "abstained_when_unanswerable": _mean([r["abstained"] for r in unanswerable]),
                "n_unanswerable": len(unanswerable),
                "abstained_when_answerable": _mean([r["abstained"] for r in answerable]),
                "language_mismatch": _mean([r["answer_language"] != r["question_language"] for r in decided]),
                "language_undetermined": 1 - len(decided) / len(g) if g else math.nan,
                "broken_per_question": broken / len(g) if g else math.nan,
                "broken_per_call": broken / calls if calls else math.nan,
                **{f"broken_{c}": sum(r["broken_calls"][c] for r in g) for c in CATEGORIES},
                "simpleqa_f_score": f.get("f_score", math.nan),
                "simpleqa_correct_given_attempted": f.get("correct_given_attempted", math.nan),
                "simpleqa_not_attempted": f.get("not_attempted", math.nan),
            })
    return out


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) or "–" for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def summary_markdown(summary: Sequence[dict[str, Any]], metrics: Sequence[dict[str, Any]],
                     preference: Sequence[dict[str, Any]], header: str) -> str:
    """summary.md: the run's settings, the curve, the cost and the internal metrics as tables."""
    parts = [header, "## Accuracy and cost against the tool-call budget b",
             _table(summary, CSV_COLUMNS),
             "## Abstention, language mismatch and SimpleQA F-score",
             _table(metrics, ("model", "budget", "n_unanswerable", "abstained_when_unanswerable",
                              "abstained_when_answerable", "language_mismatch", "language_undetermined",
                              "simpleqa_f_score", "simpleqa_correct_given_attempted", "simpleqa_not_attempted")),
             "## Broken tool calls",
             _table(metrics, ("model", "budget", "broken_per_question", "broken_per_call",
                              *(f"broken_{c}" for c in CATEGORIES)))]
    if preference:
        parts += ["## Side-by-side preference against the baseline (mean P̄)",
                  _table(preference, ("model", "baseline", "budget", "pairs", "preference"))]
    return "\n\n".join(parts) + "\n"
