"""Budget-forced evaluation (RECIPE.md §5): accuracy against the tool-call budget b, cost per query, the
write-up's internal metrics, and their figures.

    from searchjax.eval import EvalConfig, load_policy, load_questions, run_sweep, RuleGrader, load_prices

- `harness`: EvalConfig, the sweep over models × questions × budgets × samples through the rollout driver,
  resume from results.jsonl, the reports (`searchjax eval` is its CLI);
- `graders`: short-answer EM / F1, SimpleQA grades and F-score, FRAMES judgements (rule and LLM back ends);
- `cost`: billed tokens of a multi-turn rollout × a dated price table → cents per query;
- `calls`: broken tool calls by category; `results`: the results.jsonl lines; `summary`: summary.csv and the
  internal metrics; `preference`: side-by-side P̄ through a reward model; `plots`: the two PNGs;
- `dataset`: the questions (QA JSONL or a public benchmark file).
"""

from searchjax.eval.cost import PriceTable, load_prices
from searchjax.eval.dataset import EvalQuestion, load_benchmark, load_questions
from searchjax.eval.graders import LLMGrader, RuleGrader, simpleqa_f_score
from searchjax.eval.harness import EvalConfig, PolicyModel, load_policy, run_sweep
from searchjax.eval.preference import load_preference_scorer, preference_vs_baseline

__all__ = [
    "EvalConfig",
    "EvalQuestion",
    "LLMGrader",
    "PolicyModel",
    "PriceTable",
    "RuleGrader",
    "load_benchmark",
    "load_policy",
    "load_preference_scorer",
    "load_prices",
    "load_questions",
    "preference_vs_baseline",
    "run_sweep",
    "simpleqa_f_score",
]
