"""`searchjax eval`: the budget-forced evaluation (accuracy against b, cost per query, internal metrics, plots).

Settings come from EvalConfig's defaults (the write-up's, as in configs/eval/default.yaml), then --config, then
the flags. Every input is checked before a model is loaded: the questions (a bad row is `file:line: reason`),
the index, the model directories, the price table and the output directory. A rerun with the same --out
resumes: finished trajectories in results.jsonl are skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from searchjax.cli.common import CLIError, check_input_dir, float_in, positive_int, run_command


def parse_budgets(text: str) -> tuple[int, ...]:
    """argparse type: "0-10", "0,2,4" or "3" -> a tuple of distinct non-negative budgets, in the given order."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            out += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--budgets must look like 0-10, 0,2,4 or 3, got {text!r}") from None
    if not out or min(out) < 0 or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"--budgets needs distinct non-negative budgets, got {text!r}")
    return tuple(out)


def _config(args: argparse.Namespace):
    from searchjax.config import load_yaml
    from searchjax.eval.harness import EvalConfig

    cfg = load_yaml(EvalConfig, args.config) if args.config else EvalConfig()
    flags = {"budgets": args.budgets, "samples": args.samples, "temperature": args.temperature,
             "max_new_tokens": args.max_new_tokens, "max_results": args.results, "seed": args.seed,
             "slots": args.slots, "max_len": args.max_len,
             "grader": args.grader, "judge_url": args.judge_url, "judge_model": args.judge_model,
             "prices": args.prices}
    try:
        return dataclasses.replace(cfg, **{k: v for k, v in flags.items() if v is not None})
    except TypeError as e:  # EvalConfig's own checks on the flags' values
        raise CLIError(str(e)) from None


def _backend(index: str):
    from searchjax.search import HttpBackend, TantivyBackend

    if index.startswith(("http://", "https://")):
        return HttpBackend(index)
    return TantivyBackend(check_input_dir(index, "--index"))


def _questions(args: argparse.Namespace):
    from searchjax.eval.dataset import load_benchmark, load_questions, parse_benchmark

    if args.questions:
        return load_questions(args.questions), str(args.questions)
    name, path = parse_benchmark(args.benchmark)
    return load_benchmark(name, path), args.benchmark


def _price_models(specs: list[str], labels: list[str]) -> dict[str, str]:
    """--price-model [LABEL=]NAME: NAME for LABEL, or for every model without a label."""
    out: dict[str, str] = {}
    for spec in specs:
        label, sep, name = spec.rpartition("=")
        if sep and label not in labels:
            raise CLIError(f"--price-model {spec!r}: no model labelled {label!r} (labels: {labels})")
        for target in ([label] if sep else labels):
            out[target] = name
    return out


@run_command
def _eval(args: argparse.Namespace) -> int:
    from searchjax.eval.cost import DEFAULT_PRICES, load_prices
    from searchjax.eval.graders import LLMGrader, RuleGrader
    from searchjax.eval.harness import load_policy, parse_model_spec, run_sweep
    from searchjax.eval.preference import load_preference_scorer
    from searchjax.rewards.rubrics import OpenAIChatClient

    cfg = _config(args)
    questions, source = _questions(args)
    specs = [parse_model_spec(s) for s in args.model]
    for _, path in specs:
        check_input_dir(path, "--model", needs=("config.json", "tokenizer.json"))
    labels = [label for label, _ in specs]
    if len(set(labels)) != len(labels):
        raise CLIError(f"--model labels must be unique, got {labels}")
    prices = load_prices(cfg.prices or DEFAULT_PRICES)
    price_models = _price_models(args.price_model or [], labels)
    for label in labels:
        prices.price(price_models.get(label, cfg.price_model))
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out}: is a file, expected a directory")
    if not out.parent.is_dir():
        raise CLIError(f"--out {out}: the directory {out.parent} does not exist")
    if (args.baseline is None) != (args.reward_model is None):
        raise CLIError("--baseline and --reward-model go together (the side-by-side preference metric)")
    if args.baseline is not None and args.baseline not in labels:
        raise CLIError(f"--baseline {args.baseline!r} is not one of the --model labels {labels}")
    if args.reward_model is not None and not args.reward_model.startswith(("http://", "https://")):
        check_input_dir(args.reward_model, "--reward-model", needs=("config.json", "tokenizer.json"))
    backend = _backend(args.index)
    grader = LLMGrader(OpenAIChatClient(cfg.judge_url, cfg.judge_model)) if cfg.grader == "llm" else RuleGrader()
    models = [load_policy(label, path) for label, path in specs]
    scorer = load_preference_scorer(args.reward_model) if args.reward_model else None
    report = run_sweep(models, questions, backend, cfg, out, grader=grader, prices=prices, questions_source=source,
                       price_models=price_models, scorer=scorer, baseline=args.baseline, progress=not args.quiet)
    for row in report.summary:
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}))
    stats = {label: {"trajectories": s.trajectories, "tokens": s.tokens, "tokens_per_s": round(s.tokens_per_s, 1)}
             for label, s in report.stats.items()}
    print(json.dumps({"resumed": report.resumed, "run": stats, "out": str(out)}), file=sys.stderr)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("eval", help="budget-forced evaluation: accuracy against b = 0..10, cost, metrics",
                              description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", required=True, metavar="[LABEL=]DIR",
                   help="HF checkpoint directory with tokenizer.json; repeat for several models (label = path)")
    p.add_argument("--index", required=True, help="tantivy index directory or the search service's http:// URL")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--questions", help="QA JSONL ({id, question, answer, aliases, ...} per line)")
    source.add_argument("--benchmark", metavar="NAME=FILE", help="a public benchmark file in its published format "
                        "(simpleqa, frames, bamboogle, sealqa, webwalkerqa, deepdive)")
    p.add_argument("--budgets", type=parse_budgets, help="tool-call budgets b, e.g. 0-10 (config default 0-10)")
    p.add_argument("--out", required=True, help="output directory (a rerun with it resumes)")
    p.add_argument("--samples", type=positive_int, help="samples per question and budget (config default 1)")
    p.add_argument("--temperature", type=float_in(0.0, 10.0), help="sampling temperature (config default 0.6)")
    p.add_argument("--max-new-tokens", type=positive_int, help="policy tokens per trajectory (config default 8192)")
    p.add_argument("--seed", type=int, help="base PRNG seed (config default 0)")
    p.add_argument("--config", help="an EvalConfig YAML (configs/eval/default.yaml)")
    p.add_argument("--prices", help="price table YAML (default configs/eval/prices.yaml)")
    p.add_argument("--price-model", action="append", metavar="[LABEL=]NAME",
                   help="the price-table entry for a model (or every model); config default qwen3.5-plus")
    p.add_argument("--grader", choices=("rule", "llm"), help="grading back end (config default rule)")
    p.add_argument("--judge-url", help="OpenAI-compatible endpoint of the LLM grader")
    p.add_argument("--judge-model", help="model name at --judge-url")
    p.add_argument("--slots", type=positive_int, help="concurrent decodes (config default 32)")
    p.add_argument("--results", type=positive_int,
                   help="search results a call shows, 1..10 (config default 10, the write-up's); a policy trained on "
                        "fewer (data sft --results) should be evaluated with as many")
    p.add_argument("--max-len", type=positive_int, help="cache positions per slot (config default 32768, capped at "
                   "the model's positions)")
    p.add_argument("--baseline", metavar="LABEL", help="side-by-side preference of every other model against this "
                   "one (needs --reward-model)")
    p.add_argument("--reward-model", metavar="DIR|URL", help="the reward model scoring the pairs: a checkpoint "
                   "directory with tokenizer.json, or a `searchjax serve-rm` URL")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_eval)
