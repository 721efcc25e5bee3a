"""Issue 12 §4: the base reward on a fixed probe set of training prompts, at a GRPO run's saved checkpoints.

    JAX_PLATFORMS=cpu python tools/grpo_probe.py --run RUN --index DIR --steps 0 8 16 24 32 40 [--n 128]
        [--temperature 0 | --temperature 1 --samples 4] [--qa-hops 2 3] [--seed 0] [--out probe.json]
        [--records probe.jsonl] [--png probe.png]
    python tools/grpo_probe.py --replot NAME=probe.json [NAME=probe.json ...] --png probes.png

The in-loop reward/base of step t is the mean r_base over that step's batch: N prompts drawn fresh at every step,
each rolled out G times at T = 1. Most of its step-to-step swing is which prompts were drawn (a 2-hop question the
policy solves beside a 3-hop one it never does), so a linear fit over ~40 steps resolves only large slopes. This
tool holds the prompts fixed: n QA prompts drawn once (seeded) from the run's own training pool (its prompts
files, split data.train_split, data.qa_hops or the hop counts of --qa-hops; searchjax.train.grpo.load_prompts),
rolled out with the policy of each listed step (step 0: the starting policy; the others restored from
RUN/checkpoints) by the project's agent with the run's rollout settings (budget, results per search, token
limit, engine), greedy by default (or K samples at temperature T, the way the loop samples), and scored with the
run's own r_base (searchjax.train.rl.base_reward):

    o_{q,s} = (1/K) Σ_k r_base(q, k, s),   acc_s = (1/n) Σ_q o_{q,s}

Trend: the OLS slope of acc_s on s. Its 95% interval is a bootstrap over the prompts (B resamples of the n
prompts with replacement, the slope refitted on each; percentiles 2.5 / 97.5), which keeps one prompt's outcomes
at every step together: they are correlated (the same question, a slowly moving policy), where a t-interval over
the per-step means would treat the steps as independent samples. "rises" when the whole interval is above 0.
Beside it, first vs last listed step paired per prompt: gained (o rose), lost (o fell) and the exact two-sided
sign test on them (for greedy 0/1 outcomes that is McNemar's test). With T > 0 every step uses the same sampling
keys for a prompt (common random numbers), so what differs between steps is the policy, not the draws.
--png draws acc_s, overall and by hop count, and the tool calls per rollout against the step; --replot draws
saved reports (several runs' probes on one figure) without rolling anything out.

What it measures: training prompts, most of which the SFT data may hold verbatim with a worked answer (157 of the
200 2-3-hop probe prompts of RESULTS.md session 36, answered 61% by that SFT policy against 9% for the other 43),
so a rise here can be a rise on fine-tuned questions; the held-out evaluation (tools/eval_sft.py) is what the
issue 12 targets are measured on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from collections import defaultdict
from collections.abc import Sequence
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
    """The first and last listed steps paired per prompt: gained (o rose; wrong → right for 0/1 outcomes), lost
    (o fell), and the exact two-sided sign test on them (McNemar's test for 0/1 outcomes)."""
    diff = np.asarray(outcomes)[:, -1] - np.asarray(outcomes)[:, 0]
    gained, lost = int((diff > 0).sum()), int((diff < 0).sum())
    return {"gained": gained, "lost": lost, "mcnemar_p": mcnemar_exact(lost, gained)}


def plot(reports: dict[str, dict], path: str) -> None:
    """acc_s (all prompts, then each hop count) and tool calls per rollout against the step, one line per report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hops = sorted({h for rep in reports.values() for by in rep["accuracy_by_hops"].values() for h in by},
                  key=lambda h: (not h.isdigit(), int(h) if h.isdigit() else 0, h))
    panels = ["all", *hops, "calls"]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.0), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        for name, rep in reports.items():
            steps = [int(k) for k in rep["accuracy"]]
            if panel == "all":
                y = [rep["accuracy"][str(k)] for k in steps]
            elif panel == "calls":
                y = [rep["mean_tool_calls"][str(k)] for k in steps]
            else:
                y = [rep["accuracy_by_hops"][str(k)][panel][0] / rep["accuracy_by_hops"][str(k)][panel][1]
                     if panel in rep["accuracy_by_hops"][str(k)] else float("nan") for k in steps]
            ax.plot(steps, y, marker="o", label=name)
        sampling = {f"T = {rep['temperature']}, K = {rep.get('samples', 1)}" for rep in reports.values()}
        title = {"all": "r_base, probe prompts", "calls": "tool calls per rollout"}.get(panel, f"r_base, {panel}-hop")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
    axes.flat[0].legend(fontsize=7, title="; ".join(sorted(sampling)), title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def probe_prompts(cfg: GRPOConfig, n: int, seed: int, qa_hops: Sequence[int] | None = None) -> list[RLPrompt]:
    """n QA prompts drawn once from the run's training pool: every QA source, the run's split, its data.qa_hops
    or `qa_hops` instead when given (rubric sources are left out)."""
    if qa_hops:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, qa_hops=tuple(qa_hops)))
    pool = [r for src, rows in zip(cfg.data.sources, load_prompts(cfg)) if src.kind == "qa" for r in rows]
    if len(pool) < n:
        raise ValueError(f"grpo_probe: the run's QA training pool has {len(pool)} prompts, fewer than --n {n}")
    return [RLPrompt.of(r, "qa", cfg.rollout.budget) for r in random.Random(seed).sample(pool, n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", help="a GRPO run directory (RUN/config.yaml, RUN/checkpoints)")
    ap.add_argument("--index", help="the search index the run used")
    ap.add_argument("--steps", type=int, nargs="+", help="saved steps to probe, 0 = the starting policy (at least two)")
    ap.add_argument("--n", type=int, default=128, help="probe prompts, drawn once from the run's QA training pool")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--samples", type=int, default=1, help="rollouts per prompt and step (K; needs T > 0 when > 1)")
    ap.add_argument("--qa-hops", type=int, nargs="+", metavar="H",
                    help="draw from the run's QA files with these hop counts instead of its data.qa_hops (to probe "
                         "runs trained on different hop counts on the same prompts)")
    ap.add_argument("--seed", type=int, default=0, help="draws the prompts, and the sampling key when T > 0")
    ap.add_argument("--out", help="the report (JSON)")
    ap.add_argument("--records", help="one row per rollout (JSONL): id, hops, step, sample, r_base, calls, answer")
    ap.add_argument("--png", help="draw the probe (or the --replot reports) here")
    ap.add_argument("--replot", nargs="+", metavar="NAME=JSON", help="only draw saved reports (with --png)")
    args = ap.parse_args(argv)
    if args.replot:
        if not args.png:
            ap.error("--replot needs --png")
        reports = {}
        for name, sep, path in (spec.rpartition("=") for spec in args.replot):  # a label may hold "=", a path not
            if not Path(path).is_file():
                ap.error(f"--replot {name + sep + path}: no report file {path}")
            reports[name if sep else Path(path).stem] = json.loads(Path(path).read_text())
        plot(reports, args.png)
        return 0
    missing = [flag for flag, v in (("--run", args.run), ("--index", args.index), ("--steps", args.steps)) if not v]
    if missing:
        ap.error(f"{', '.join(missing)} required (or --replot)")
    steps = sorted(set(args.steps))
    if len(steps) < 2 or steps[0] < 0:
        ap.error(f"--steps: at least two distinct steps >= 0 are needed for a trend, got {args.steps}")
    if args.samples < 1 or (args.samples > 1 and args.temperature <= 0):
        ap.error(f"--samples {args.samples}: at least 1, and more than 1 only with --temperature > 0 (greedy "
                 "rollouts of one prompt are all the same)")
    run = Path(args.run)
    if not (run / "config.yaml").exists():
        ap.error(f"--run {run}: no config.yaml (not a run directory)")
    cfg = load_train_config(GRPOConfig, run / "config.yaml")
    prompts = probe_prompts(cfg, args.n, args.seed, args.qa_hops)
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
    report: dict = {"run": str(run), "n": len(prompts), "qa_hops": args.qa_hops or cfg.data.qa_hops, "steps": steps,
                    "temperature": args.temperature, "samples": args.samples, "budget": r.budget, "accuracy": {},
                    "accuracy_by_hops": {}, "mean_tool_calls": {}, "weights_version": {}}
    rows = []
    for j, step in enumerate(steps):
        if step:
            params = restored[step][1]
            driver.set_params(driver.cast_like(params), version=step)
        records = defaultdict(list)
        for rec in agent.rollouts([p.item for p in prompts], args.samples, jax.random.key(args.seed)):
            records[rec.prompt_id].append(rec)
        hops, calls = defaultdict(list), []
        for i, p in enumerate(prompts):
            scores = []
            for rec in sorted(records[p.prompt_id], key=lambda rec: rec.group_index):
                scores.append(base_reward(rec, p, cfg.rewards, judge))
                calls.append(rec.tool_calls)
                rows.append({"id": p.prompt_id, "hops": p.record.get("hops"), "step": step,
                             "sample": rec.group_index, "r_base": scores[-1], "tool_calls": rec.tool_calls,
                             "finish_reason": rec.finish_reason, "answer": rec.answer})
            outcomes[i, j] = np.mean(scores)
            hops[str(p.record.get("hops"))].append(outcomes[i, j])
        report["accuracy"][str(step)] = float(outcomes[:, j].mean())
        report["accuracy_by_hops"][str(step)] = {h: [float(sum(v)), len(v)] for h, v in sorted(hops.items())}
        report["mean_tool_calls"][str(step)] = float(np.mean(calls))
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
    if args.png:
        plot({run.name: report}, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
