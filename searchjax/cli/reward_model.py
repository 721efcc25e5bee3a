"""Reward-model commands: `searchjax serve-rm` (the PreferenceScorer over loopback HTTP) and the
`searchjax data preferences` subcommand (registered from searchjax.cli.data).

    searchjax data preferences --world DIR --qa FILE --rubric FILE --out FILE [--config YAML] [--seed S]
                               [--pairs-per-category N] [--judge-url URL --judge-model NAME] [--index DIR|URL]
    searchjax serve-rm --model RUN/final [--host 127.0.0.1] [--port 8766] [--batch-pairs N] [--buckets 512 ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from searchjax.cli.common import (CLIError, INDEX_HELP, add_overwrite, check_input_dir, check_input_file,
                                  check_output, check_port, int_at_least, run_command)
from searchjax.config import ConfigError, load_yaml


def _preference_config(args: argparse.Namespace):
    from searchjax.data.preferences import PreferenceConfig

    cfg = load_yaml(PreferenceConfig, check_input_file(args.config, "--config")) if args.config else PreferenceConfig()
    over = {k: v for k, v in (("seed", args.seed), ("pairs_per_category", args.pairs_per_category),
                              ("max_results", args.results), ("thoughts", args.thoughts)) if v is not None}
    if args.judge_url and "llm" not in cfg.judges:
        over["judges"] = (*cfg.judges, "llm")
    try:
        cfg = dataclasses.replace(cfg, **over)
    except TypeError as e:  # PreferenceConfig's own checks on the flags' values
        raise ConfigError(f"{args.config or 'data preferences'}: {e}") from None
    if "llm" in cfg.judges and not args.judge_url:
        raise CLIError(f"{args.config}: judges lists 'llm' but no --judge-url gives its endpoint")
    return cfg


@run_command
def _preferences(args: argparse.Namespace) -> int:
    from searchjax.cli.data import _backend, _finish, _load_kb, _qa_record, _world
    from searchjax.data.jsonl import read_jsonl
    from searchjax.data.preferences import LLMPairJudge, PreferenceBuilder, RubricJudge, RuleJudge, judge_and_filter
    from searchjax.data.rubric_data import validate_rubric_record
    from searchjax.rewards.rubrics import OpenAIChatClient

    out = check_output(args.out, args.overwrite)
    world = _world(args.world)
    cfg = _preference_config(args)
    qa, qa_read = read_jsonl(check_input_file(args.qa, "--qa"), validate=_qa_record, on_error=args.on_error)
    rubric, rubric_read = read_jsonl(check_input_file(args.rubric, "--rubric"), validate=validate_rubric_record,
                                     on_error=args.on_error)
    judges = {"rules": RuleJudge(), "rubrics": RubricJudge()}
    if args.judge_url:
        judges["llm"] = LLMPairJudge(OpenAIChatClient(args.judge_url, args.judge_model))
    builder = PreferenceBuilder(_load_kb(world), _backend(world, args.index), cfg)
    pairs = list(builder.build(qa, rubric))
    kept, report = judge_and_filter(pairs, [judges[name] for name in cfg.judges], cfg.min_agree)
    if "llm" in judges:
        report["llm_unparsed"] = judges["llm"].unparsed
    summary = {"read_qa": qa_read.as_dict(), "read_rubric": rubric_read.as_dict(), "built": len(pairs),
               **report, **dict(sorted(builder.summary.items()))}
    return _finish(out, kept, "preference pair", summary)


def add_preferences_command(data_subparsers) -> None:
    """`data preferences` (called by searchjax.cli.data.register)."""
    from searchjax.data.sft import THOUGHT_STYLES

    p = data_subparsers.add_parser("preferences", help="agreement-filtered preference pairs for the reward model "
                                                       "(RECIPE.md §4)")
    p.add_argument("--world", required=True, help="directory written by `searchjax world build`")
    p.add_argument("--qa", required=True, help="synthetic QA JSONL from `data synth-qa`")
    p.add_argument("--rubric", required=True, help="rubric JSONL from `data rubric`")
    p.add_argument("--out", required=True, help="output preference JSONL (prompt / chosen / rejected, TRL's shape)")
    p.add_argument("--config", help="a PreferenceConfig YAML (configs/data/preferences.yaml)")
    p.add_argument("--seed", type=int, help="PRNG seed (default: the config's)")
    p.add_argument("--pairs-per-category", type=int_at_least(1), help="at most this many pairs per category "
                                                                       "before the filter (default: the config's)")
    p.add_argument("--results", type=int_at_least(1), help="search results per call in the pairs' trajectories "
                                                           "(default: the config's max_results); as the policy's "
                                                           "rollouts show them")
    p.add_argument("--thoughts", choices=THOUGHT_STYLES,
                   help="the trajectories' thinking style, as the SFT data's `data sft --thoughts` (default: the "
                        "config's)")
    p.add_argument("--judge-url", help="OpenAI-compatible endpoint of an LLM pairwise judge (adds judge 'llm')")
    p.add_argument("--judge-model", default="default", help="model name sent to --judge-url")
    p.add_argument("--index", help=INDEX_HELP + " (default: WORLD/index, built if missing)")
    p.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                   help="a malformed input row stops the command (raise) or is skipped and counted (skip)")
    add_overwrite(p)
    p.set_defaults(func=_preferences)


@run_command
def _serve_rm(args: argparse.Namespace) -> int:
    from searchjax.rewards.reward_model import CONFIG_KEY
    from searchjax.rollout.preference import PreferenceScorer, serve_reward_model

    model = check_input_dir(args.model, "--model", needs=("config.json", "tokenizer.json"))
    if CONFIG_KEY not in (model / "config.json").read_text(encoding="utf-8"):
        raise CLIError(f"--model {model}: not a reward model checkpoint (config.json has no {CONFIG_KEY!r}); "
                       "train one with `searchjax train rm`")
    print(f"loading the reward model {model}", file=sys.stderr, flush=True)
    scorer = PreferenceScorer.load(model, args.dtype, batch_pairs=args.batch_pairs, buckets=args.buckets)

    def ready(url: str) -> None:
        print(f"serving the {scorer.kind} reward model {model} on {url} (POST /score, GET /health)", flush=True)

    serve_reward_model(scorer, host=args.host, port=args.port, on_ready=ready)
    return 0


def register(subparsers) -> None:
    from searchjax.rollout.preference import DEFAULT_BUCKETS, DEFAULT_PORT

    p = subparsers.add_parser("serve-rm", help="serve a reward model's P̄(x, rollout, reference) over HTTP "
                                               "(searchjax/rollout/preference.py: the protocol)")
    p.add_argument("--model", required=True, help="reward-model checkpoint (RUN/final of `searchjax train rm`)")
    p.add_argument("--port", type=check_port, default=DEFAULT_PORT, help="TCP port (0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1: loopback only)")
    p.add_argument("--batch-pairs", type=int_at_least(1), default=8, help="pairs per jitted call (both orders)")
    p.add_argument("--buckets", type=int_at_least(1), nargs="+", default=list(DEFAULT_BUCKETS),
                   help="row lengths the batches are padded to (one compile each)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="parameter dtype")
    p.set_defaults(func=_serve_rm)
