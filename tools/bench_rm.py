"""Reward-model scoring throughput: PreferenceScorer ÷ the bare jitted forward on the same padded batches.

For each scorer (pointwise, pairwise) on a model preset, N pairs (x, a, b) of token ids with lengths drawn like the
preference data's (prompt 100–700 tokens, responses 10–300), or the pairs of a preference file:

- scorer: `PreferenceScorer.score_ids(triples)`: canonical order, rows laid out, length-sorted, bucketed, both
  orders in one jitted call per batch, P̄ fetched back to host (everything a GRPO step pays for scoring);
- bare:   `jax.jit(values)` over the same [2·batch_pairs, W] token batches, already on the device, results left
  there (the forward alone).

Both are timed warm (every bucket compiled first), alternately, `--repeats` times; the medians give pairs/s and
the ratio scorer ÷ bare (target ≥ 0.8). The text path (rendering + tokenisation) is timed separately when
`--data` is given.

The model is a preset with a random backbone and a random head (`--preset`), or a trained reward model
(`--model RUN/final`: its backbone, head, tokenizer and scorer kind; `--data` then defaults to its tokenizer and
only that scorer is timed; a model with the likelihood term gets the responses' assistant masks, in both paths).

    JAX_PLATFORMS=cpu python tools/bench_rm.py [--preset tiny] [--pairs 64] [--batch-pairs 8] [--repeats 5] \
        [--data prefs.jsonl --tokenizer tokenizer.json] [--model RUN/final] [--buckets 128 256 ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import numpy as np

from searchjax.model import init_params, load_preset
from searchjax.rewards.reward_model import PairTemplate, from_policy, make_scorer, values
from searchjax.rollout.preference import DEFAULT_BUCKETS, PreferenceScorer


def synthetic_triples(n: int, vocab: int, seed: int = 0) -> list[tuple[list[int], list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    ids = lambda k: rng.integers(1, vocab, k).tolist()  # noqa: E731
    return [(ids(rng.integers(100, 700)), ids(rng.integers(10, 300)), ids(rng.integers(10, 300))) for _ in range(n)]


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(kind: str, cfg, params, triples, batch_pairs: int, repeats: int, encode=None, scorer_obj=None,
          buckets=DEFAULT_BUCKETS) -> dict:
    """Median pairs/s of PreferenceScorer.score_ids and of the bare jitted forward on its batches (docstring)."""
    if scorer_obj is None:
        template = PairTemplate.from_encoder(encode) if kind == "pairwise" and encode else \
            PairTemplate((3, 4, 5), (3, 6, 5), (3, 7, 5)) if kind == "pairwise" else None
        scorer_obj = make_scorer(kind, cfg, template)
    scorer = PreferenceScorer(params, scorer_obj, encode or (lambda s: []), batch_pairs=batch_pairs, buckets=buckets)
    batches = [(jax.device_put(t), jax.device_put(n), None if m is None else jax.device_put(m))
               for _, t, n, _, m in scorer._batches(triples)]
    forward = jax.jit(values, static_argnames=("cfg",))

    def bare():
        jax.block_until_ready([forward(params, t, n, cfg, mask=m) for t, n, m in batches])

    scorer.score_ids(triples)  # compile every bucket of both
    bare()
    times = {"scorer": [], "bare": []}
    for _ in range(repeats):
        times["scorer"].append(_time(lambda: scorer.score_ids(triples)))
        times["bare"].append(_time(bare))
    med = {k: statistics.median(v) for k, v in times.items()}
    widths = sorted({int(t.shape[1]) for t, _, _ in batches})
    return {"scorer": kind, "pairs": len(triples), "batches": len(batches), "widths": widths,
            "scorer_pairs_per_s": round(len(triples) / med["scorer"], 2),
            "bare_pairs_per_s": round(len(triples) / med["bare"], 2), "ratio": round(med["bare"] / med["scorer"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--batch-pairs", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--data", help="a preference JSONL to score instead of synthetic ids (needs --tokenizer)")
    ap.add_argument("--tokenizer", help="tokenizer.json for --data (default: --model's)")
    ap.add_argument("--model", help="a trained reward model (RUN/final) instead of a random preset")
    ap.add_argument("--buckets", type=int, nargs="+", default=list(DEFAULT_BUCKETS))
    args = ap.parse_args()
    encode, loaded = None, None
    if args.model:
        from searchjax.rewards.reward_model import load_reward_model

        loaded = load_reward_model(args.model)
    if args.data and not (args.tokenizer or args.model):
        ap.error("--data needs --tokenizer (or --model, whose tokenizer.json is used)")
    if args.data:
        from searchjax.chat import load_tokenizer
        from searchjax.data.preferences import encode_prompt_response, read_preferences

        tok = load_tokenizer(args.tokenizer or args.model)
        encode = tok.encode
        rows = read_preferences(args.data)[0][: args.pairs]
        start = time.perf_counter()
        masks = loaded is not None and loaded[1].likelihood  # a likelihood-term model also reads assistant masks
        triples = []
        for r in rows:
            x, pieces, *m = encode_prompt_response(encode, r["prompt"], [r["chosen"], r["rejected"]], masks=masks)
            triples.append((x, *pieces, *(list(v) for v in (m[0] if m else ()))))
        print(json.dumps({"text_path_pairs_per_s": round(len(rows) / (time.perf_counter() - start), 1)}))
        cfg = load_preset(args.preset).replace(vocab_size=tok.vocab_size, pad_token_id=tok.special.pad)
    else:
        cfg = loaded[1].cfg if loaded else load_preset(args.preset).replace(vocab_size=2048, pad_token_id=0)
        triples = synthetic_triples(args.pairs, cfg.vocab_size)
        if loaded is not None and loaded[1].likelihood:  # synthetic masks: every response token the assistant's
            triples = [(x, a, b, [1] * len(a), [1] * len(b)) for x, a, b in triples]
    if loaded is not None:
        params, scorer = loaded
        cfg, kinds = scorer.cfg, (scorer.kind,)
    else:
        params = from_policy(init_params(cfg, jax.random.key(0)), cfg)
        params = params.replace(head=jax.random.normal(jax.random.key(1), params.head.shape))
        scorer, kinds = None, ("pointwise", "pairwise")
    print(f"# {jax.devices()[0].device_kind} x{jax.device_count()}, "
          f"{'model ' + args.model if args.model else 'preset ' + args.preset}, {len(triples)} pairs"
          f"{' of ' + args.data if args.data else ' (synthetic ids)'}, batch_pairs {args.batch_pairs}, "
          f"buckets {args.buckets}, median of {args.repeats}", flush=True)
    for kind in kinds:
        print(json.dumps(bench(kind, cfg, params, triples, args.batch_pairs, args.repeats, encode, scorer,
                               tuple(args.buckets))), flush=True)


if __name__ == "__main__":
    main()
