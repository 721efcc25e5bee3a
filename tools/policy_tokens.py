"""How many policy tokens the expert's own trajectories take: the floor for an agent's max_new_tokens.

`AgentConfig.max_new_tokens` caps the policy tokens of a whole rollout (every assistant turn together, not one
turn), and a rollout that reaches it ends with finish_reason "max_tokens" and no answer. A cap below what the SFT
trajectories themselves need cuts a policy that imitates them perfectly. For each SFT row (split train by
default) this counts the tokens the SFT loss trains on (the assistant turns: `encode_conversation`'s mask),
grouped by data category and number of search calls, with the share of rows above each --cap. The mask also holds
each turn's opening "<think>\n", which the agent's generation prompt supplies and does not count, so the figures
are above the agent's count by those few tokens per turn.

    python tools/policy_tokens.py --data sft.jsonl --tokenizer tokenizer.json [--cap 384 400 1024] [--every 5]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np

from searchjax.chat import encode_conversation, load_tokenizer
from searchjax.data.jsonl import read_jsonl
from searchjax.search import SEARCH_WEB_TOOL


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="SFT JSONL as `searchjax data sft` writes it")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json the policy uses")
    ap.add_argument("--split", default="train", help="rows of this split (default train)")
    ap.add_argument("--cap", type=int, nargs="+", default=[384, 400, 1024], help="max_new_tokens values to test")
    ap.add_argument("--every", type=int, default=1, help="read every k-th row (a sample; default all)")
    args = ap.parse_args(argv)

    tok = load_tokenizer(args.tokenizer)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(r for r in read_jsonl(args.data)[0] if r.get("split", "train") == args.split):
        if i % args.every:
            continue
        msgs = row["messages"]
        calls = sum(len(m.get("tool_calls") or []) for m in msgs if m["role"] == "assistant")
        _, mask = encode_conversation(msgs, tok, [SEARCH_WEB_TOOL])
        groups[f"{row.get('category', '?')} / {calls} calls"].append(int(mask.sum()))
    if not groups:
        raise SystemExit(f"error: no rows of split {args.split!r} in {args.data}")
    everything = [n for v in groups.values() for n in v]

    def figures(v):
        a = np.asarray(v)
        return {"rows": len(a), "median": int(np.median(a)), "p90": int(np.percentile(a, 90)), "max": int(a.max()),
                **{f"share_over_{c}": round(float(np.mean(a > c)), 3) for c in args.cap}}

    print(json.dumps({"data": args.data, "split": args.split, "every": args.every,
                      "groups": {k: figures(v) for k, v in sorted(groups.items())}, "all": figures(everything)},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
