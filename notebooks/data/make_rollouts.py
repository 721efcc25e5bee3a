"""Write the stored rollouts of notebooks/reward_shaping.ipynb: GRPO-style groups through the real agent loop.

    python notebooks/data/make_rollouts.py --workspace OUT      # OUT of `searchjax pipeline` (default: tiny)

The tiny policies of this repository answer no question right (RESULTS.md), so groups of theirs would have no
winner and the reward's winner branch would go unseen. The tokens here come from a scripted policy instead
(`searchjax.testing.scripted.ScriptedDriver` playing `ScriptedPolicy`); the rest is the project's own code:
`SearchAgent.rollouts` (prompt, tool turns, budget, the real tantivy search), the records as the rollout code
writes them, the policy's G rollouts and G paired reference rollouts of each prompt with the GRPO stage's keys,
r_base graded by `searchjax.train.rl.base_reward`, and s = P̄(x, y_i, y_ref,i) scored by the workspace's reward
model in both orders (`PreferenceScorer`), as the GRPO loop does.

The scripted policy draws its plan from the rollout's own key: k search calls (k = b + 1 makes one call past the
budget, which fails), 1 to 4 sentences of thinking a turn (one rollout in ten rambles on into max_new_tokens: no
answer), then the gold answer or another question's answer, with P(correct) growing with k. Its log μ is 0 (a
script is deterministic given its key). Outputs: rollouts.jsonl.gz (gold and r_base filled) and preferences.json.
The outputs are reproducible: the same workspace gives the same records (but for their wall-clock timings).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import tempfile
from pathlib import Path

import jax
import numpy as np

from searchjax.chat import load_tokenizer
from searchjax.data.jsonl import read_jsonl
from searchjax.rewards.config import RewardConfig
from searchjax.rewards.rubrics import RuleJudge
from searchjax.rollout import AgentConfig, SearchAgent
from searchjax.rollout.preference import PreferenceScorer
from searchjax.rollout.records import REFERENCE, group_records
from searchjax.search import TantivyBackend
from searchjax.testing.scripted import ScriptedDriver
from searchjax.testing.workspace import pipeline_workspace, tiny_workspace
from searchjax.train.rl import PreferenceInputs, ReferenceCache, RLPrompt, base_reward, gold_answers, prompt_key

HERE = Path(__file__).resolve().parent
FILLER = ("let me think about this", "the question asks for one entity", "I should check the documents",
          "the first result mentions it", "that does not look right", "maybe the other page says more",
          "the population figure matches", "so the chain leads here")


@dataclasses.dataclass(frozen=True)
class Plan:
    calls: int
    sentences: int  # of thinking per turn
    answer: str


class ScriptedPolicy:
    """The script of a `ScriptedDriver`: each rollout's `Plan` (drawn from its key), played turn by turn."""

    def __init__(self, questions: dict[str, dict], budget: int, reference: bool):
        self.questions, self.budget, self.reference = questions, budget, reference
        self.plans: dict[int, Plan] = {}

    def plan(self, rollout) -> Plan:
        rng = np.random.default_rng(np.asarray(jax.random.key_data(rollout.key)))
        calls = int(rng.choice(3)) if self.reference else int(rng.choice(self.budget + 2, p=_call_weights(self.budget)))
        row = self.questions[rollout.item.prompt_id]
        others = [q["answer"] for pid, q in sorted(self.questions.items()) if q["answer"] != row["answer"]]
        correct = rng.random() < min(0.15 + 0.2 * calls, 0.8)
        rambles = rng.random() < 0.1  # thinks on until max_new_tokens: no answer
        return Plan(calls, 80 if rambles else int(rng.integers(1, 5)),
                    row["answer"] if correct else str(rng.choice(others)))

    def __call__(self, rollout, turn: int) -> str:
        plan = self.plans.setdefault(id(rollout), self.plan(rollout))
        rng = np.random.default_rng([turn, plan.sentences, plan.calls])
        thinking = ". ".join(rng.choice(FILLER, size=plan.sentences)).capitalize() + "."
        if turn < plan.calls:
            query = rollout.item.question if turn == 0 else f"{rollout.item.question} {rng.choice(FILLER)}"
            return (f"{thinking}\n</think>\n\n<tool_call>\n<function=search_web>\n<parameter=query>\n{query}\n"
                    "</parameter>\n</function>\n</tool_call>")
        return f"{thinking}\n</think>\n\nThe answer is {plan.answer}.<|im_end|>"


def _call_weights(budget: int) -> np.ndarray:
    """P(k calls), k = 0..b+1: most rollouts search once or twice; b + 1 (one call past the budget) is rare."""
    w = np.asarray([2.0, 3.0, 3.0] + [1.5] * (budget - 2) + [0.7])[: budget + 2]
    return w / w.sum()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workspace", help="a `searchjax pipeline` OUT directory (default: a tiny one, built)")
    p.add_argument("--prompts", type=int, default=8, help="questions of split train (N)")
    p.add_argument("--group", type=int, default=4, help="rollouts per prompt (G)")
    p.add_argument("--budget", type=int, default=3, help="search_web calls per rollout (b)")
    p.add_argument("--max-new-tokens", type=int, default=640, help="policy tokens per rollout, all turns")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(HERE), help="directory of rollouts.jsonl.gz and preferences.json")
    args = p.parse_args()

    ws = pipeline_workspace(args.workspace) if args.workspace else tiny_workspace(tempfile.mkdtemp())
    rows = [r for r in read_jsonl(ws.prompts[0])[0] if r.get("split", "train") == "train"][: args.prompts]
    prompts = [RLPrompt.of(r, "qa", args.budget) for r in rows]
    scorer, tokenizer = PreferenceScorer.load(ws.reward_model), load_tokenizer(ws.policy)
    backend, questions = TantivyBackend(ws.index), {str(r["id"]): r for r in rows}
    cfg = AgentConfig(args.budget, args.max_new_tokens, max_results=2)
    root = jax.random.key(args.seed)
    policy = SearchAgent(ScriptedDriver(tokenizer, ScriptedPolicy(questions, args.budget, False)), backend, cfg)
    reference = SearchAgent(ScriptedDriver(tokenizer, ScriptedPolicy(questions, args.budget, True)), backend, cfg)
    ref_key = jax.random.fold_in(root, 0x5EF)
    refs = reference.rollouts([q.item for q in prompts], args.group, ref_key, REFERENCE, paired=True,
                              item_keys=[prompt_key(ref_key, q.prompt_id) for q in prompts])
    records = policy.rollouts([q.item for q in prompts], args.group, jax.random.fold_in(root, 1))
    by_id = {q.prompt_id: q for q in prompts}
    for r in records + refs:
        r.gold = gold_answers(by_id[r.prompt_id].record)
        r.r_base = base_reward(r, by_id[r.prompt_id], RewardConfig(), RuleJudge())
    cache = ReferenceCache(args.group)
    cache.add_records(refs)
    groups = group_records(records, args.group, [q.prompt_id for q in prompts])
    triples = PreferenceInputs(tokenizer.encode).triples(prompts, groups.grid, cache)
    scores = np.asarray(scorer.score_ids(triples), np.float32).reshape(len(prompts), args.group)

    out = Path(args.out)
    with gzip.open(out / "rollouts.jsonl.gz", "wt", encoding="utf-8") as f:
        for r in records + refs:
            f.write(json.dumps(dataclasses.asdict(r), ensure_ascii=False) + "\n")
    scored = {f"{q.prompt_id}/{i}": round(float(scores[n, i]), 6) for n, q in enumerate(prompts)
              for i in range(args.group)}
    (out / "preferences.json").write_text(json.dumps(
        {"reward_model": str(ws.reward_model), "group_size": args.group, "preference": scored}, indent=1) + "\n")
    print(f"{len(records)} policy + {len(refs)} reference rollouts, r_base mean "
          f"{np.mean([r.r_base for r in records]):.2f}, s in [{scores.min():.3f}, {scores.max():.3f}] -> {out}")


if __name__ == "__main__":
    main()
