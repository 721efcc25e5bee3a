"""The side-by-side preference metric: its arithmetic with a deterministic scorer, and a real reward-model
checkpoint behind the project's PreferenceScorer."""

import jax
import numpy as np
import pytest

from searchjax.eval.dataset import EvalQuestion
from searchjax.eval.preference import load_preference_scorer, preference_vs_baseline
from searchjax.search import budget_instruction

QUESTIONS = {q: EvalQuestion(q, f"Question {q}?", ("x",)) for q in ("q1", "q2", "q3")}


def _row(model, qid, budget, answer, sample=0):
    return {"model": model, "question_id": qid, "budget": budget, "sample": sample, "answer": answer}


class LengthScorer:
    """P̄ = σ((len a − len b) / 4): the longer answer is preferred."""

    def __init__(self):
        self.calls = []

    def score(self, prompts, rollouts, references):
        self.calls.append((prompts, rollouts, references))
        return 1 / (1 + np.exp(-(np.array([len(a) - len(b) for a, b in zip(rollouts, references)]) / 4)))


def test_mean_preference_per_budget_over_shared_trajectories():
    rows = [_row("base", "q1", 0, "ab"), _row("base", "q2", 0, "abcd"), _row("base", "q1", 2, "a"),
            _row("sft", "q1", 0, "abcdef"), _row("sft", "q2", 0, "abcd"), _row("sft", "q3", 0, "zzz"),  # q3: no pair
            _row("sft", "q1", 2, "abcde"), _row("other", "q1", 2, "a")]
    scorer = LengthScorer()
    out = preference_vs_baseline(rows, QUESTIONS, "base", scorer, ["base", "sft", "other"], [0, 2])
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    assert [(r["model"], r["budget"], r["pairs"]) for r in out] == [("sft", 0, 2), ("sft", 2, 1), ("other", 2, 1)]
    assert out[0]["preference"] == pytest.approx((sig(1.0) + sig(0.0)) / 2)
    assert out[1]["preference"] == pytest.approx(sig(1.0)) and out[2]["preference"] == 0.5
    prompts, rollouts, references = scorer.calls[0]
    assert rollouts == ["abcdef", "abcd"] and references == ["ab", "abcd"]
    assert prompts[0][-1] == {"role": "user", "content": "Question q1?"}  # the prompt the policies saw
    assert budget_instruction(0) in prompts[0][0]["content"]
    with pytest.raises(ValueError, match="baseline 'gpt'"):
        preference_vs_baseline(rows, QUESTIONS, "gpt", LengthScorer(), ["base", "sft"], [0])

    class Short:
        def score(self, prompts, rollouts, references):
            return np.zeros(1)

    with pytest.raises(ValueError, match=r"\(1,\) scores for 2 pairs"):
        preference_vs_baseline(rows, QUESTIONS, "base", Short(), ["base", "sft"], [0])


@pytest.mark.slow
def test_a_reward_model_checkpoint_through_the_preference_scorer(tokenizer, tmp_path):
    from searchjax.model import load_preset
    from searchjax.rewards.reward_model import init_reward_params, make_scorer, save_reward_model

    cfg = load_preset("tiny").replace(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.special.pad)
    params = init_reward_params(cfg, jax.random.key(0))
    params = params.replace(head=jax.random.normal(jax.random.key(1), params.head.shape))  # a non-zero head
    save_reward_model(tmp_path / "rm", params, make_scorer("pointwise", cfg))
    with pytest.raises(ValueError, match="no tokenizer.json"):
        load_preference_scorer(str(tmp_path / "rm"))
    tokenizer.save(tmp_path / "rm" / "tokenizer.json")
    scorer = load_preference_scorer(str(tmp_path / "rm"))
    rows = [_row("base", "q1", 1, "I don't know."), _row("base", "q2", 1, "Paris"), _row("base", "q3", 1, "x"),
            _row("sft", "q1", 1, "Grawiam Joraex"), _row("sft", "q2", 1, "Paris"), _row("sft", "q3", 1, "y")]
    (out,) = preference_vs_baseline(rows, QUESTIONS, "base", scorer, ["base", "sft"], [1])
    (back,) = preference_vs_baseline(rows, QUESTIONS, "sft", scorer, ["base", "sft"], [1])
    assert out["pairs"] == 3 and out["preference"] + back["preference"] == pytest.approx(1.0, abs=1e-6)
    assert out["preference"] != pytest.approx(0.5)  # the head tells the answers apart (an equal pair scores ½)
