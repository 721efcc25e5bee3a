"""Does the policy itself know which response is right? A reward-model diagnostic on held-out preference pairs.

A Bradley–Terry reward model is the policy backbone with a value head on its last token (searchjax.rewards.
reward_model). When it stays at chance on a category, this tool asks whether the information is in the backbone
at all: the policy's own log-likelihood of each response, with no head and no training,

    L(r) = Σ_{t ∈ r} log π(r_t | x, r_<t)          the response tokens' log-probs given the rendered prompt x
    Δ_sum(x, a, b)  = L(a) − L(b)                  chosen a, rejected b
    Δ_mean(x, a, b) = L(a)/|a| − L(b)/|b|          per token (length-normalised)

and the accuracy Δ > 0 per category. High accuracy with a value head at chance says the backbone carries the
signal and the head or its training does not read it out; chance here too says the backbone never learnt it.
With --seen SFT.jsonl (the policy's SFT data) every figure is also given over the "unseen" pairs, whose user turn
is no user turn of a train-split SFT row: the policy may remember the answers of questions it was trained on
(preference pairs are split by answer entity, SFT rows by seed entity, so a held-out pair's question can be one).
x ‖ r is rendered as the SFT data is (the chat template with the search_web schema), so the policy reads the
format it was trained on.

    JAX_PLATFORMS=cpu python tools/likelihood_prefs.py --model sft/final --data preferences.jsonl --split dev \
        [--seen sft.jsonl] [--widths 512 1024 2048 3072 4096] [--batch 8]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from searchjax.chat import load_tokenizer
from searchjax.data.jsonl import read_jsonl
from searchjax.data.preferences import encode_prompt_response, read_preferences, user_text
from searchjax.losses.logprobs import token_logprobs_from_logits
from searchjax.model import forward, load_hf
from searchjax.search import SEARCH_WEB_TOOL


def response_logprob_sums(logprob_fn, rows: Sequence[tuple[Sequence[int], Sequence[int]]], widths: Sequence[int],
                          batch: int, pad_id: int) -> np.ndarray:
    """Σ log π over each row's response tokens: rows are (x ids, r ids); float64 [N].

    logprob_fn(tokens [B, W]) -> [B, W - 1] log π(tokens[:, t + 1] | tokens[:, ≤ t]). Rows are sorted by length
    and right-padded to the smallest width in `widths` that holds the batch's longest (causal: padding after a
    row never changes its log-probs)."""
    lengths = [len(x) + len(r) for x, r in rows]
    if max(lengths) > max(widths):
        raise ValueError(f"a row has {max(lengths)} tokens, more than the largest width {max(widths)}")
    out = np.zeros(len(rows), np.float64)
    order = sorted(range(len(rows)), key=lambda i: lengths[i])
    for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        width = min(w for w in widths if w >= max(lengths[i] for i in idx))
        tokens = np.full((batch, width), pad_id, np.int32)
        mask = np.zeros((batch, width - 1), bool)  # mask[:, t]: tokens[:, t + 1] is a response token
        for j, i in enumerate(idx):
            x, r = rows[i]
            tokens[j, :len(x) + len(r)] = [*x, *r]
            mask[j, len(x) - 1: len(x) + len(r) - 1] = True
        logp = np.asarray(logprob_fn(jnp.asarray(tokens)), np.float64)
        out[idx] = (logp * mask).sum(axis=1)[:len(idx)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a policy checkpoint directory (HF format, tokenizer.json inside)")
    ap.add_argument("--data", required=True, help="preference JSONL (as `searchjax data preferences` writes)")
    ap.add_argument("--split", default=None, help="only rows of this split (default: every row)")
    ap.add_argument("--seen", help="SFT JSONL: also report the pairs whose user turn no train row of it has")
    ap.add_argument("--widths", type=int, nargs="+", default=[512, 1024, 2048, 3072, 4096])
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args(argv)

    rows = read_preferences(args.data)[0]
    if args.split is not None:
        rows = [r for r in rows if r["split"] == args.split]
    if not rows:
        raise SystemExit(f"error: no preference rows in {args.data} (split {args.split!r})")
    cfg, params = load_hf(args.model, dtype="float32")
    tok = load_tokenizer(f"{args.model}/tokenizer.json")
    chosen, rejected = [], []
    for r in rows:
        x, (a, b) = encode_prompt_response(tok.encode, r["prompt"], [r["chosen"], r["rejected"]], [SEARCH_WEB_TOOL])
        chosen.append((x, a))
        rejected.append((x, b))

    @jax.jit
    def logprob_fn(tokens):
        return token_logprobs_from_logits(forward(params, tokens, cfg)[:, :-1], tokens[:, 1:])

    start = time.perf_counter()
    pad = tok.special.pad
    la = response_logprob_sums(logprob_fn, chosen, args.widths, args.batch, pad)
    lb = response_logprob_sums(logprob_fn, rejected, args.widths, args.batch, pad)
    na = np.array([len(r) for _, r in chosen], np.float64)
    nb = np.array([len(r) for _, r in rejected], np.float64)
    d_sum, d_mean = la - lb, la / na - lb / nb

    by = defaultdict(list)
    for i, r in enumerate(rows):
        by[r["category"]].append(i)
    by["all"] = list(range(len(rows)))
    if args.seen:
        trained = {m["content"] for r in read_jsonl(args.seen)[0] if r.get("split", "train") == "train"
                   for m in r["messages"] if m["role"] == "user"}  # every user turn of a train row
        for c, ix in list(by.items()):
            by[f"{c} (unseen)"] = [i for i in ix if user_text(rows[i]["prompt"]) not in trained]

    def figures(ix):
        if not ix:
            return {"pairs": 0}
        return {"pairs": len(ix), "accuracy_sum": round(float(np.mean(d_sum[ix] > 0)), 4),
                "accuracy_mean": round(float(np.mean(d_mean[ix] > 0)), 4),
                "median_delta_sum": round(float(np.median(d_sum[ix])), 3)}

    print(json.dumps({"model": args.model, "data": args.data, "split": args.split,
                      "categories": {c: figures(ix) for c, ix in sorted(by.items())},
                      "seconds": round(time.perf_counter() - start, 1)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
