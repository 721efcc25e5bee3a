"""Two policies on the same held-out questions, paired: which questions each gets right, and whether the
difference is more than chance (the exact McNemar test, searchjax.eval.summary.mcnemar_exact).

    python tools/compare_records.py --a recs_sft.jsonl --b recs_grpo.jsonl [--out compare.json]

The inputs are `tools/eval_sft.py --records` files (one JSON object per question: id, hops, correct, tool_calls,
finish_reason). Both must hold the same question ids (else an error names the ids that differ). The report: n;
accuracy and mean tool calls of each; both / a_only / b_only / neither; the McNemar p; and the same counts per hop
count, so a gain on 2-hop questions and a loss on 4-hop ones are not netted away unseen. When every record holds
its turns (eval_sft.py writes them), also the repeated searches of each policy: a search_web call whose query
(whitespace-trimmed, case-folded) equals an earlier query of the same trajectory, and so gets the same results
from the index; per question (a_repeats, b_repeats) and per right and wrong answer (a_repeats_right, ...).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from searchjax.atomic import atomic_write_text
from searchjax.data.jsonl import DataError, iter_jsonl
from searchjax.eval.summary import mcnemar_exact

FIELDS = ("id", "correct", "tool_calls")


def _check(row: dict) -> None:
    missing = [f for f in FIELDS if f not in row]
    if missing:
        raise ValueError(f"missing field(s) {missing} (an eval_sft.py --records row has {list(FIELDS)})")


def load(path: str) -> dict[str, dict]:
    """id → record of an eval_sft records file; a row missing a field (file:line) or a repeated id is an error."""
    out: dict[str, dict] = {}
    for row in iter_jsonl(path, validate=_check):
        if row["id"] in out:
            raise DataError(f"{path}: question id {row['id']!r} appears twice")
        out[row["id"]] = row
    return out


def repeated_queries(row: dict) -> int | None:
    """Searches of a record whose query repeats an earlier query of its trajectory (trimmed, case-folded); None
    when the record holds no turns."""
    if not isinstance(row.get("turns"), list):
        return None
    queries = [call["arguments"]["query"].strip().casefold() for turn in row["turns"]
               for call in turn.get("tool_calls") or []
               if call.get("name") == "search_web" and isinstance(call.get("arguments"), dict)
               and isinstance(call["arguments"].get("query"), str)]
    return len(queries) - len(set(queries))


def _mean(xs: list[int]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def repeats(pairs: list[tuple[dict, dict]]) -> dict[str, float | None]:
    """Mean repeated searches (`repeated_queries`) per question and per right / wrong answer of each side; {} when
    a record has no turns."""
    out: dict[str, float | None] = {}
    for side, rows in (("a", [a for a, _ in pairs]), ("b", [b for _, b in pairs])):
        reps = [repeated_queries(r) for r in rows]
        if any(x is None for x in reps):
            return {}
        out[f"{side}_repeats"] = _mean(reps)
        out[f"{side}_repeats_right"] = _mean([x for x, r in zip(reps, rows) if r["correct"]])
        out[f"{side}_repeats_wrong"] = _mean([x for x, r in zip(reps, rows) if not r["correct"]])
    return out


def counts(pairs: list[tuple[dict, dict]]) -> dict[str, float]:
    """Paired counts, accuracies, mean calls, the McNemar p and the repeated searches (when the records hold
    their turns) of (A, B) record pairs of the same questions."""
    both = sum(a["correct"] and b["correct"] for a, b in pairs)
    a_only = sum(a["correct"] and not b["correct"] for a, b in pairs)
    b_only = sum(b["correct"] and not a["correct"] for a, b in pairs)
    n = len(pairs)
    return {"n": n, "a_correct": both + a_only, "b_correct": both + b_only, "both": both, "a_only": a_only,
            "b_only": b_only, "neither": n - both - a_only - b_only,
            "a_calls": sum(a["tool_calls"] for a, _ in pairs) / n,
            "b_calls": sum(b["tool_calls"] for _, b in pairs) / n,
            "mcnemar_p": mcnemar_exact(a_only, b_only), **repeats(pairs)}


def compare(a: dict[str, dict], b: dict[str, dict]) -> dict:
    """The report of the module docstring for two loaded records files."""
    if set(a) != set(b):
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        raise DataError(f"the two files hold different questions: {len(only_a)} only in --a (e.g. {only_a[:3]}), "
                         f"{len(only_b)} only in --b (e.g. {only_b[:3]})")
    if not a:
        raise DataError("no questions to compare (both files are empty)")
    pairs = [(a[k], b[k]) for k in sorted(a)]
    by_hops: dict[int, list] = defaultdict(list)
    for x, y in pairs:
        by_hops[int(x.get("hops", 0))].append((x, y))
    return {**counts(pairs), "by_hops": {str(h): counts(v) for h, v in sorted(by_hops.items())}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="records of the first policy (e.g. the SFT policy)")
    ap.add_argument("--b", required=True, help="records of the second policy, same questions")
    ap.add_argument("--out", help="also write the report here (JSON)")
    args = ap.parse_args(argv)
    try:
        report = compare(load(args.a), load(args.b))
    except DataError as e:
        raise SystemExit(f"compare_records: {e}") from None
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        atomic_write_text(args.out, text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
