"""Budget-forced sweep throughput and reproducibility, measured side by side in one run.

1. Throughput: generated tokens/s of the whole sweep (searchjax.eval.harness: every question × budget × sample
   through the driver, with tool calls, grading, language identification and one fsynced results line per
   trajectory) ÷ the bare RolloutDriver's tokens/s on the same batch shape: the same first-turn prompts, the
   same engine and slots, the same max_new_tokens and stops, nothing else (target ≥ 0.8). Beside it, the sweep
   ÷ plain agent rollouts of the same items in one `run_rollouts` call (tool turns included, no per-trajectory
   keys, grading or results file): the harness's own cost. A warm-up sweep compiles every prefill bucket the
   timed runs use; then each side runs `--repeats` times, interleaved, and the best of each counts.
2. Reproducibility: the sweep's results.jsonl is the same bytes in every repeat (same seed).

    JAX_PLATFORMS=cpu python tools/bench_eval.py --model runs/demo/model --index runs/demo/index \\
        --questions runs/demo/qa.jsonl [--budgets 0-10] [--samples 2] [--max-new-tokens 64] [--slots 8]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import jax

from searchjax.cli.eval import parse_budgets
from searchjax.eval.cost import load_prices
from searchjax.eval.dataset import load_questions
from searchjax.eval.graders import RuleGrader
from searchjax.eval.harness import EvalConfig, _engine_for, load_policy, run_sweep, trajectory_key
from searchjax.rollout import AgentConfig, PromptItem, Request, RolloutDriver, SearchAgent, run_rollouts
from searchjax.search import TantivyBackend


def bare_requests(agent: SearchAgent, questions, cfg: EvalConfig) -> list[Request]:
    """The sweep's first-turn requests, as the agent would issue them."""
    out = []
    for q in questions:
        for b in cfg.budgets:
            for s in range(cfg.samples):
                item = PromptItem.from_record({"id": q.id, "question": q.question}, b)
                out.append(Request(tuple(agent.prompt_ids(item)), cfg.max_new_tokens,
                                   trajectory_key(cfg.seed, q.id, b, s), cfg.sampling, agent.stop_ids))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--index", required=True)
    p.add_argument("--questions", required=True)
    p.add_argument("--budgets", type=parse_budgets, default=tuple(range(11)))
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()

    cfg = EvalConfig(budgets=args.budgets, samples=args.samples, max_new_tokens=args.max_new_tokens,
                     slots=args.slots, max_len=args.max_len)
    questions = load_questions(args.questions)
    model = load_policy("policy", args.model)
    backend, prices = TantivyBackend(args.index), load_prices()
    engine = _engine_for(model, cfg, None)
    driver = RolloutDriver(engine, model.params)
    agent = SearchAgent(driver, backend, AgentConfig(max_new_tokens=cfg.max_new_tokens, sampling=cfg.sampling))
    requests = bare_requests(agent, questions, cfg)
    items = [PromptItem.from_record({"id": f"{q.id}/{b}/{s}", "question": q.question}, b)
             for q in questions for b in cfg.budgets for s in range(cfg.samples)]
    bare, plain, sweep, files = [], [], [], []
    with tempfile.TemporaryDirectory() as root:
        sweep_args = dict(grader=RuleGrader(), prices=prices, questions_source=args.questions, engine=engine,
                          progress=False)
        run_sweep([model], questions, backend, cfg, Path(root) / "warm-up", **sweep_args)  # compiles every bucket
        for i in range(args.repeats):
            t0 = time.perf_counter()
            tokens = sum(len(c.tokens) for c in driver.run(requests))
            bare.append(tokens / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            records = run_rollouts(agent, items, 1, jax.random.key(cfg.seed))
            plain.append(sum(r.response_length for r in records) / (time.perf_counter() - t0))
            out = Path(root) / f"run{i}"
            t0 = time.perf_counter()
            report = run_sweep([model], questions, backend, cfg, out, **sweep_args)
            whole = time.perf_counter() - t0
            stats = report.stats["policy"]
            sweep.append(stats.tokens_per_s)
            files.append((out / "results.jsonl").read_bytes())
            calls = sum(json.loads(line)["tool_calls"] for line in files[-1].decode().splitlines())
            print(f"repeat {i}: bare driver {bare[-1]:.1f} tokens/s ({tokens} tokens); agent rollouts "
                  f"{plain[-1]:.1f} tokens/s; sweep {sweep[-1]:.1f} tokens/s ({stats.tokens} tokens, "
                  f"{stats.trajectories} trajectories, {calls} tool calls; {whole:.1f} s with reports)")
    print(f"throughput ratio sweep / bare driver (best of {args.repeats} each): {max(sweep):.1f} / {max(bare):.1f} = "
          f"{max(sweep) / max(bare):.3f}  (target >= 0.8)")
    print(f"sweep / plain agent rollouts: {max(sweep):.1f} / {max(plain):.1f} = {max(sweep) / max(plain):.3f}")
    print(f"{len(requests)} trajectories, {engine.max_concurrent_decodes} slots; results.jsonl identical across "
          f"repeats: {all(f == files[0] for f in files)}")


if __name__ == "__main__":
    main()
