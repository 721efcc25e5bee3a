"""How many held-out questions the SFT data's own expert answers, by hop count and results per search.

The SFT trajectories are the search-only solver's (searchjax.data.solvers.SearchSolver): one search per hop,
innermost first, the entity most result snippets state. A policy that imitates it perfectly answers what it
answers and no more, so its accuracy on the held-out questions of tools/eval_sft.py (the first N
non-augmented questions of split dev) is the ceiling of imitation for a given number of results per search,
and its tool-response tokens are what each result costs.

    python tools/expert_ceiling.py --index RUN/index/index --qa RUN/qa/qa.jsonl --results 1 2 3 5 10 \
        [--n 100] [--tokenizer RUN/tokenizer/tokenizer.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

from searchjax.data.jsonl import read_jsonl
from searchjax.data.solvers import SearchSolver
from searchjax.rewards.answers import answer_correct
from searchjax.search import TantivyBackend


def ceiling(solver: SearchSolver, rows: list[dict], tokenizer=None) -> dict:
    """[correct, questions] by exact hop count, and the median tool-response tokens per call (with a tokenizer)."""
    by_hops: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    per_call: list[float] = []
    for row in rows:
        trace = solver.solve(row["question"])
        ok = trace.answer is not None and answer_correct(trace.answer, [row["answer"], *row.get("aliases", [])])
        by_hops[row["hops"]][0] += int(ok)
        by_hops[row["hops"]][1] += 1
        if tokenizer is not None and trace.calls:
            per_call.append(statistics.mean(len(tokenizer.encode(text)) for _, _, text in trace.calls))
    out: dict = {"by_hops": {str(h): v for h, v in sorted(by_hops.items())}}
    two, more = by_hops.get(2, [0, 0]), [sum(v[i] for h, v in by_hops.items() if h > 2) for i in (0, 1)]
    out["2hop"] = two[0] / two[1] if two[1] else None
    out["3_4hop"] = more[0] / more[1] if more[1] else None
    if per_call:
        out["tool_tokens_per_call_median"] = statistics.median(per_call)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--qa", required=True)
    ap.add_argument("--results", type=int, nargs="+", default=[1, 2, 3, 5, 10])
    ap.add_argument("--n", type=int, default=100, help="held-out questions (split dev, not augmented), in file order")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--tokenizer", help="tokenizer.json: also report tool-response tokens per call")
    args = ap.parse_args(argv)
    rows = [r for r in read_jsonl(args.qa)[0] if r.get("split") == args.split and not r.get("augmented")][: args.n]
    if not rows:
        ap.error(f"{args.qa}: no questions of split {args.split}")
    tokenizer = None
    if args.tokenizer:
        from searchjax.chat import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
    backend = TantivyBackend(args.index)
    report = {"questions": len(rows), "split": args.split}
    for k in args.results:
        report[f"results_{k}"] = ceiling(SearchSolver(backend, max_results=k), rows, tokenizer)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
