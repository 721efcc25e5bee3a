"""Issue 10 §4: the SFT policy measured with the project's own agent loop on held-out data (greedy).

    JAX_PLATFORMS=cpu python tools/eval_sft.py --model RUN/final --index DIR --world DIR --qa qa.jsonl \
        --results 3 [--n 120] [--abstain 40] [--max-new-tokens 1024] [--max-len 4096] [--out report.json]

Held-out questions are the QA rows of split "dev" (`data synth-qa` puts every question of a held-out seed entity
there, and the SFT stage trains on split "train" only), not augmented, the first question of each chain (--copies:
all). It reports, at budget 5 unless said otherwise:
  (a) the share of assistant turns that parse without errors                        target ≥ 0.95
  (b) the share of questions with at least one search call                           target ≥ 0.90
  (c) accuracy (r_base: the stated answer matches the gold or an alias) on 2-hop and 3–4-hop questions, and the
      same policy at budget 0                                                          target ≥ 0.50 / ≥ 0.25
  (d) on questions about entities that do not exist in the world, the share answered with an abstention
                                                                                       target ≥ 0.80
and, per budget, accuracy by exact hop count ([correct, questions]), tool calls and finish reasons.
--max-new-tokens caps a rollout's policy tokens over all its turns (AgentConfig.max_new_tokens); session 10 ran
with 400, which is below what the SFT data's own 4-hop trajectories take (tools/policy_tokens.py).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict

import jax
import numpy as np

from searchjax.chat import parse_assistant
from searchjax.data.jsonl import read_jsonl, write_jsonl
from searchjax.data.questions import describe
from searchjax.data.synth import one_per_chain
from searchjax.eval.graders import is_abstention
from searchjax.rewards import qa_correct
from searchjax.rollout import AgentConfig, PromptItem, RolloutDriver, Sampling, SearchAgent, SearchJaxEngine
from searchjax.search import SEARCH_WEB_TOOL, TantivyBackend
from searchjax.search.world import KnowledgeBase

ABSTAIN_RELATIONS = ("founded_year", "born_year", "published_year", "population")
SYLLABLES = ("zor", "vel", "quin", "brax", "tul", "mey", "dro", "fen", "kas", "lor", "nix", "pav", "ryo", "sem")


def fake_questions(kb: KnowledgeBase, n: int, seed: int) -> list[dict]:
    """Questions about made-up names the world does not hold (a seed other than the SFT data's)."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        word = lambda: "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()  # noqa: E731
        name = f"{word()} {word()}"
        if kb.by_name(name):
            continue
        out.append({"id": f"fake-{len(out):04d}", "question": f"What is {describe(rng.choice(ABSTAIN_RELATIONS), 'o', name)}?"})
    return out


def turn_parse_ok(record) -> list[bool]:
    return [parse_assistant(t["text"], [SEARCH_WEB_TOOL]).ok for t in (record.turns or [])]


def run(agent: SearchAgent, rows: list[dict], budget: int) -> list:
    items = [PromptItem.from_record({"id": r["id"], "question": r["question"]}, budget) for r in rows]
    return agent.rollouts(items, 1, jax.random.key(0))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--index", required=True)
    ap.add_argument("--world", required=True)
    ap.add_argument("--qa", required=True)
    ap.add_argument("--results", type=int, default=3)
    ap.add_argument("--n", type=int, default=120, help="held-out questions (split dev), in file order")
    ap.add_argument("--copies", action="store_true",
                    help="keep every question of a chain: QA files written before session 24 ask one chain under "
                         "up to four openers (\"Name ...\" / \"What is ...?\"), and sessions 10-24 measured with "
                         "them (their first 100 held-out questions are 66 chains); default: the first of each")
    ap.add_argument("--abstain", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=1024,
                    help="policy tokens per rollout, all turns together (tools/policy_tokens.py: the expert's own "
                         "4-call trajectories need up to ~530 at the science BPE, so 400 cut 61%% of them)")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=4096, help="the engine's cache length (prompt + every turn)")
    ap.add_argument("--out")
    ap.add_argument("--records", help="write the budget-5 held-out rollouts here (JSONL: question, gold, hops, "
                                      "correct, finish reason, answer, the turns), to read what went wrong")
    args = ap.parse_args(argv)

    qa, _ = read_jsonl(args.qa)
    held = [r for r in qa if r.get("split") == "dev" and not r.get("augmented")]
    held = (held if args.copies else one_per_chain(held))[: args.n]
    kb = KnowledgeBase.load(args.world)
    fakes = fake_questions(kb, args.abstain, seed=20261201)
    engine = SearchJaxEngine.from_dir(args.model, max_concurrent_decodes=args.slots, max_len=args.max_len,
                                      max_prefill_length=2048, sampling=Sampling(0.0))
    agent = SearchAgent(RolloutDriver(engine, engine.load_params()), TantivyBackend(args.index),
                        AgentConfig(budget=5, max_new_tokens=args.max_new_tokens, sampling=Sampling(0.0),
                                    max_results=args.results))
    t0 = time.perf_counter()
    report: dict = {"model": args.model, "held_out": len(held), "abstain_questions": len(fakes)}
    for budget in (5, 0):
        records = {r.prompt_id: r for r in run(agent, held, budget)}
        by_hops: dict[str, list[float]] = defaultdict(list)
        exact: dict[int, list[float]] = defaultdict(list)
        parsed, searched = [], []
        for row in held:
            rec = records[row["id"]]
            ok = qa_correct(rec.answer, [row["answer"], *row.get("aliases", [])])
            by_hops["2" if row["hops"] == 2 else "3-4"].append(float(ok))
            exact[row["hops"]].append(float(ok))
            parsed += turn_parse_ok(rec)
            searched.append(rec.tool_calls > 0)
        report[f"b{budget}"] = {
            "turn_parse_rate": float(np.mean(parsed)), "search_rate": float(np.mean(searched)),
            "accuracy_2hop": float(np.mean(by_hops["2"])), "n_2hop": len(by_hops["2"]),
            "accuracy_3_4hop": float(np.mean(by_hops["3-4"])), "n_3_4hop": len(by_hops["3-4"]),
            "accuracy_by_hops": {str(h): [int(sum(v)), len(v)] for h, v in sorted(exact.items())},
            "mean_tool_calls": float(np.mean([records[r["id"]].tool_calls for r in held])),
            "finish_reasons": dict(sorted({k: sum(rec.finish_reason == k for rec in records.values())
                                           for k in {rec.finish_reason for rec in records.values()}}.items())),
            "examples": [{"q": r["question"], "gold": r["answer"], "answer": records[r["id"]].answer[:200]}
                         for r in held[:3]],
        }
        if budget == 5 and args.records:
            write_jsonl(args.records, [
                {"id": r["id"], "question": r["question"], "gold": r["answer"], "hops": r["hops"],
                 "correct": bool(qa_correct(records[r["id"]].answer, [r["answer"], *r.get("aliases", [])])),
                 "finish_reason": records[r["id"]].finish_reason, "answer": records[r["id"]].answer,
                 "tool_calls": records[r["id"]].tool_calls, "turns": records[r["id"]].turns} for r in held])
    fake_records = run(agent, fakes, 5)
    # An abstention is a finished answer that declines; an empty answer cut by max_tokens does not count.
    report["abstention_rate"] = float(np.mean([r.finish_reason == "answer" and is_abstention(r.answer)
                                               for r in fake_records]))
    report["abstain_examples"] = [r.answer[:160] for r in fake_records[:3]]
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(report, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
