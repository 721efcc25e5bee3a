"""Held-out accuracy of a reward model, per category: RUN/final scored on a preference file by PreferenceScorer.

Every pair (x, a = chosen, b = rejected) goes through `PreferenceScorer.deltas_ids` (both orders in one jitted
call, the scorer GRPO uses), which gives Δ(x, a, b), Δ(x, b, a) and the order average P̄(x, a, b) = σ(½[Δ_ab −
Δ_ba]). Per category (and "all"):

- accuracy:        P̄ > ½, the chosen response preferred after averaging both orders;
- accuracy_ab / accuracy_ba: σ(Δ(x, a, b)) > ½ and σ(Δ(x, b, a)) < ½, each order alone (before averaging);
- position_bias:   mean |σ(Δ_ab) − (1 − σ(Δ_ba))| before averaging (0 for the pointwise scorer);
- mean_p:          mean P̄, and pairs.

With `--train FILE` (the file the run trained on) it also counts held-out pairs whose user turn or source record
is a training pair's, which must be 0 for a held-out figure. Prints one JSON object.

    JAX_PLATFORMS=cpu python tools/eval_rm.py RUN/final heldout.jsonl [--split dev] [--train train.jsonl] \
        [--batch-pairs 8] [--buckets 256 512 1024 1536]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import numpy as np

from searchjax.data.preferences import read_preferences, user_text
from searchjax.rollout.preference import PreferenceScorer


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def category_metrics(p_bar: np.ndarray, d_ab: np.ndarray, d_ba: np.ndarray) -> dict[str, float]:
    """The figures of the module docstring for pairs whose chosen response is a (label r = 1)."""
    s_ab, s_ba = _sigmoid(d_ab), _sigmoid(d_ba)
    return {"pairs": int(len(p_bar)), "accuracy": round(float(np.mean(p_bar > 0.5)), 4),
            "accuracy_ab": round(float(np.mean(s_ab > 0.5)), 4), "accuracy_ba": round(float(np.mean(s_ba < 0.5)), 4),
            "position_bias": round(float(np.mean(np.abs(s_ab - (1.0 - s_ba)))), 4),
            "mean_p": round(float(np.mean(p_bar)), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a reward-model directory (RUN/final of `searchjax train rm`)")
    ap.add_argument("data", help="preference JSONL (TRL's shapes, as `searchjax data preferences` writes)")
    ap.add_argument("--split", default=None, help="only rows of this split (default: every row)")
    ap.add_argument("--train", help="the training file: held-out pairs sharing a user turn or source are counted")
    ap.add_argument("--batch-pairs", type=int, default=8)
    ap.add_argument("--buckets", type=int, nargs="+", default=[256, 512, 1024, 1536, 2048])
    args = ap.parse_args()

    rows = read_preferences(args.data)[0]
    if args.split is not None:
        rows = [r for r in rows if r["split"] == args.split]
    if not rows:
        raise SystemExit(f"error: no preference rows in {args.data} (split {args.split!r})")
    scorer = PreferenceScorer.load(args.model, batch_pairs=args.batch_pairs, buckets=args.buckets)
    start = time.perf_counter()
    triples = scorer.encode_triples([r["prompt"] for r in rows], [r["chosen"] for r in rows],
                                    [r["rejected"] for r in rows])
    p_bar, d_ab, d_ba = scorer.deltas_ids(triples)
    seconds = time.perf_counter() - start

    by = defaultdict(list)
    for i, r in enumerate(rows):
        by[r["category"]].append(i)
    out = {"model": args.model, "data": args.data, "split": args.split, "scorer": scorer.kind,
           "categories": {c: category_metrics(p_bar[ix], d_ab[ix], d_ba[ix]) for c, ix in sorted(by.items())},
           "all": category_metrics(p_bar, d_ab, d_ba), "seconds": round(seconds, 1)}
    if args.train:
        train = read_preferences(args.train)[0]
        users = {user_text(r["prompt"]) for r in train}
        sources = {r["source"] for r in train if r["source"]}
        out["overlap_with_train"] = {"user_turn": sum(user_text(r["prompt"]) in users for r in rows),
                                     "source": sum(bool(r["source"]) and r["source"] in sources for r in rows)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
