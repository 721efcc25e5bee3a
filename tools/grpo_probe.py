"""Issue 12 §4: the base reward on a fixed probe set of training prompts, at a GRPO run's saved checkpoints.

    JAX_PLATFORMS=cpu python tools/grpo_probe.py --run RUN --index DIR --steps 0 8 16 24 32 40 [--n 128]
        [--temperature 0] [--seed 0] [--out probe.json] [--records probe.jsonl]

The in-loop reward/base of step t is the mean r_base over that step's batch: N prompts drawn fresh at every step,
each rolled out G times at T = 1. Most of its step-to-step swing is which prompts were drawn (a 2-hop question the
policy solves beside a 3-hop one it never does), so a linear fit over ~40 steps resolves only large slopes. This
tool holds the prompts fixed: n QA prompts drawn once (seeded) from the run's own training pool (its prompts
files, split data.train_split, data.qa_hops; searchjax.train.grpo.load_prompts), rolled out with the policy of
each listed step (step 0: the starting policy; the others restored from RUN/checkpoints) by the project's agent
with the run's rollout settings (budget, results per search, token limit, engine), greedy by default, and scored
with the run's own r_base (searchjax.train.rl.base_reward):

    acc_s = (1/n) Σ_q r_base(q, s)

Trend: the OLS slope of acc_s on s. Its 95% interval is a bootstrap over the prompts (B resamples of the n
prompts with replacement, the slope refitted on each; percentiles 2.5 / 97.5), which keeps one prompt's outcomes
at every step together: they are correlated (the same question, a slowly moving policy), where a t-interval over
the per-step means would treat the steps as independent samples. "rises" when the whole interval is above 0.
Beside it, first vs last listed step paired per prompt (gained, lost) with the exact McNemar p. With T > 0 every
step uses the same sampling key for a prompt (common random numbers), so what differs between steps is the policy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from collections import defaultdict
from pathlib import Path

import jax
import numpy as np

from searchjax.atomic import atomic_write_text
from searchjax.data.jsonl import write_jsonl
from searchjax.eval.summary import mcnemar_exact
from searchjax.rewards.rubrics import RuleJudge
from searchjax.rollout import RolloutDriver, Sampling, SearchAgent, SearchJaxEngine
from searchjax.search import TantivyBackend
from searchjax.train.causal import checkpoint_params
from searchjax.train.config import load_train_config
from searchjax.train.grpo import GRPOConfig, load_prompts
from searchjax.train.rl import RLPrompt, base_reward


def trend(steps: np.ndarray, outcomes: np.ndarray, resamples: int = 2000, seed: int = 0) -> dict[str, float | str]:
    """outcomes [prompts, steps] (r_base ∈ [0, 1]) → the OLS slope of the per-step mean on `steps` with its 95%
    bootstrap interval over prompts (module docstring)."""
    steps, outcomes = np.asarray(steps, float), np.asarray(outcomes, float)
    if outcomes.ndim != 2 or outcomes.shape[1] != steps.size or steps.size < 2 or outcomes.shape[0] < 1:
        raise ValueError(f"trend: need outcomes [prompts, steps] with >= 2 steps matching {steps.size} steps, got "
                         f"shape {outcomes.shape}")
    x = steps - steps.mean()

    def slopes(means: np.ndarray) -> np.ndarray:  # [..., steps] → [...]
        return (means - means.mean(-1, keepdims=True)) @ x / (x @ x)

    n = outcomes.shape[0]
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    boot = slopes(outcomes[idx].mean(axis=1))
    lo, hi = (float(v) for v in np.percentile(boot, [2.5, 97.5]))
    slope = float(slopes(outcomes.mean(axis=0)))
    word = "rises" if lo > 0 else "falls" if hi < 0 else "flat (interval spans 0)"
    return {"slope": slope, "lo": lo, "hi": hi, "trend": word, "resamples": resamples}


def first_vs_last(outcomes: np.ndarray) -> dict[str, float]:
    """The first and last listed steps paired per prompt: gained (wrong → right), lost, exact McNemar p."""
    a, b = np.asarray(outcomes)[:, 0] > 0.5, np.asarray(outcomes)[:, -1] > 0.5
    gained, lost = int((~a & b).sum()), int((a & ~b).sum())
    return {"gained": gained, "lost": lost, "mcnemar_p": mcnemar_exact(lost, gained)}


def probe_prompts(cfg: GRPOConfig, n: int, seed: int) -> list[RLPrompt]:
    """n QA prompts drawn once from the run's training pool (every QA source, the run's split and hop filter)."""
    pool = [r for src, rows in zip(cfg.data.sources, load_prompts(cfg)) if src.kind == "qa" for r in rows]
    if len(pool) < n:
        raise ValueError(f"grpo_probe: the run's QA training pool has {len(pool)} prompts, fewer than --n {n}")
    return [RLPrompt.of(r, "qa", cfg.rollout.budget) for r in random.Random(seed).sample(pool, n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a GRPO run directory (RUN/config.yaml, RUN/checkpoints)")
    ap.add_argument("--index", required=True, help="the search index the run used")
    ap.add_argument("--steps", type=int, nargs="+", required=True,
                    help="saved steps to probe, 0 = the starting policy (at least two)")
    ap.add_argument("--n", type=int, default=128, help="probe prompts, drawn once from the run's QA training pool")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--seed", type=int, default=0, help="draws the prompts, and the sampling key when T > 0")
    ap.add_argument("--out", help="the report (JSON)")
    ap.add_argument("--records", help="one row per prompt and step (JSONL): id, hops, step, r_base, calls, answer")
    args = ap.parse_args(argv)
    steps = sorted(set(args.steps))
    if len(steps) < 2 or steps[0] < 0:
        ap.error(f"--steps: at least two distinct steps >= 0 are needed for a trend, got {args.steps}")
    run = Path(args.run)
    if not (run / "config.yaml").exists():
        ap.error(f"--run {run}: no config.yaml (not a run directory)")
    cfg = load_train_config(GRPOConfig, run / "config.yaml")
    prompts = probe_prompts(cfg, args.n, args.seed)
    # Every checkpoint is restored before any rollout: a missing step fails now, not after an hour of probing.
    restored = {s: checkpoint_params(run, s) for s in steps if s}
    start = next(iter(restored.values()))[0]
    r = cfg.rollout
    engine = SearchJaxEngine.from_dir(str(start.path), max_concurrent_decodes=r.slots, max_len=r.max_len,
                                      max_prefill_length=r.max_prefill_length, sampling=Sampling(args.temperature))
    driver = RolloutDriver(engine, engine.load_params(), extend_cache=r.extend_cache)
    agent_cfg = dataclasses.replace(r.agent(), sampling=Sampling(args.temperature))
    agent = SearchAgent(driver, TantivyBackend(args.index), agent_cfg)
    judge, t0 = RuleJudge(), time.perf_counter()
    outcomes = np.zeros((len(prompts), len(steps)))
    report: dict = {"run": str(run), "n": len(prompts), "steps": steps, "temperature": args.temperature,
                    "budget": r.budget, "accuracy": {}, "accuracy_by_hops": {}, "mean_tool_calls": {},
                    "weights_version": {}}
    rows = []
    for j, step in enumerate(steps):
        if step:
            params = restored[step][1]
            driver.set_params(driver.cast_like(params), version=step)
        records = {rec.prompt_id: rec for rec in
                   agent.rollouts([p.item for p in prompts], 1, jax.random.key(args.seed))}
        hops = defaultdict(list)
        for i, p in enumerate(prompts):
            rec = records[p.prompt_id]
            outcomes[i, j] = base_reward(rec, p, cfg.rewards, judge)
            hops[str(p.record.get("hops"))].append(outcomes[i, j])
            rows.append({"id": p.prompt_id, "hops": p.record.get("hops"), "step": step, "r_base": outcomes[i, j],
                         "tool_calls": rec.tool_calls, "finish_reason": rec.finish_reason, "answer": rec.answer})
        report["accuracy"][str(step)] = float(outcomes[:, j].mean())
        report["accuracy_by_hops"][str(step)] = {h: [int(sum(v)), len(v)] for h, v in sorted(hops.items())}
        report["mean_tool_calls"][str(step)] = float(np.mean([records[p.prompt_id].tool_calls for p in prompts]))
        report["weights_version"][str(step)] = driver.version
        print(f"step {step}: r_base {report['accuracy'][str(step)]:.3f}, calls "
              f"{report['mean_tool_calls'][str(step)]:.2f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    report["trend"] = trend(np.array(steps), outcomes, seed=args.seed)
    report["first_vs_last"] = first_vs_last(outcomes)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(report, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        atomic_write_text(args.out, text + "\n")
    if args.records:
        write_jsonl(args.records, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
