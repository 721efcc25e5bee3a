"""Side-by-side preference against a baseline model through the Bradley–Terry reward model (RECIPE.md §4, §5).

For each trajectory key (question, b, sample) that both the model and the baseline answered,

    P̄(x, a, b) = σ(½[Δ(x, a, b) − Δ(x, b, a)])

with x the prompt the policies saw (the system turn stating the budget b, then the question), a the model's
answer and b the baseline's, each as one assistant turn; the metric is the mean P̄ per budget (0.5 = on par; the
write-up reports 0.602 → 0.742 after SFT+RL against a strong baseline).

The scorer is anything with the reward model's scoring interface, `score(prompts, rollouts, references) -> P̄
[N]`: `searchjax.rollout.preference.PreferenceScorer` in process (a checkpoint directory), or its
`RewardModelClient` for a `searchjax serve-rm` service (a URL). `load_preference_scorer` picks by the argument.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from searchjax.data.prompts import prompt_messages
from searchjax.eval.dataset import EvalQuestion


class PairScorer(Protocol):
    """P̄(x_i, rollout_i, reference_i) for each i: prompts are message lists, rollouts and references strings."""

    def score(self, prompts: Sequence, rollouts: Sequence, references: Sequence) -> np.ndarray: ...


def preference_vs_baseline(rows: Sequence[dict[str, Any]], questions: Mapping[str, EvalQuestion], baseline: str,
                           scorer: PairScorer, models: Sequence[str], budgets: Sequence[int]) -> list[dict[str, Any]]:
    """Mean P̄ of every other model against `baseline`, per budget, over their shared trajectories."""
    if baseline not in models:
        raise ValueError(f"preference baseline {baseline!r} is not one of the evaluated models {list(models)}")
    answers = {(r["model"], r["question_id"], r["budget"], r["sample"]): r["answer"] for r in rows}
    out = []
    for model in models:
        if model == baseline:
            continue
        for b in budgets:
            keys = sorted(k[1:] for k in answers if k[0] == model and k[2] == b and (baseline, *k[1:]) in answers)
            if not keys:
                continue
            prompts = [prompt_messages({"question": questions[q].question}, b) for q, _, _ in keys]
            p = np.asarray(scorer.score(prompts, [answers[(model, *k)] for k in keys],
                                        [answers[(baseline, *k)] for k in keys]), np.float64)
            if p.shape != (len(keys),):
                raise ValueError(f"preference scorer returned {p.shape} scores for {len(keys)} pairs")
            out.append({"model": model, "baseline": baseline, "budget": b, "pairs": len(keys),
                        "preference": float(p.mean())})
    return out


def load_preference_scorer(where: str) -> PairScorer:
    """The reward model at `where`: a `searchjax serve-rm` URL (http://...) or a checkpoint directory with its
    tokenizer.json (what `searchjax train rm` writes)."""
    from searchjax.rollout.preference import PreferenceScorer, RewardModelClient

    if where.startswith(("http://", "https://")):
        return RewardModelClient(where)
    if not (Path(where) / "tokenizer.json").exists():
        raise ValueError(f"--reward-model {where}: no tokenizer.json beside the checkpoint")
    return PreferenceScorer.load(where)
