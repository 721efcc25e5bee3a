"""`searchjax data ...`: synthetic QA, rubric chat data and its pass@4 calibration, SFT data, public QA sets."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from searchjax.config import ConfigError, load_yaml
from searchjax.data.jsonl import DataError, read_jsonl, write_jsonl
from searchjax.rewards.rubrics import ChatClientError, ModelReplyError

MAX_HOPS = 6  # SynthConfig's bound


def _hops(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    try:
        lo_i, hi_i = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--hops must look like 2-4 or 3, got {text!r}") from None
    if not 2 <= lo_i <= hi_i <= MAX_HOPS:
        raise argparse.ArgumentTypeError(f"--hops must satisfy 2 <= low <= high <= {MAX_HOPS}, got {text!r}")
    return lo_i, hi_i


def _count(minimum: int):
    """argparse type: an integer >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


def _report(summary: dict) -> None:
    print(json.dumps(summary, indent=1, sort_keys=True), file=sys.stderr)


def _backend(world: Path, index: str | None):
    from searchjax.search import TantivyBackend, build_index

    index_dir = Path(index) if index else world / "index"
    if not index_dir.exists():
        print(f"building the index of {world / 'corpus.jsonl'} into {index_dir}", file=sys.stderr)
        build_index(world / "corpus.jsonl", index_dir)
    return TantivyBackend(index_dir)


def _synth_qa(args) -> int:
    from searchjax.data.solvers import SearchSolver
    from searchjax.data.synth import QAGenerator, SynthConfig
    from searchjax.search.world import KnowledgeBase

    over = {"n": args.n, "seed": args.seed}
    if args.hops:
        over["min_hops"], over["max_hops"] = args.hops
    try:
        cfg = load_yaml(SynthConfig, args.config) if args.config else SynthConfig()
        cfg = dataclasses.replace(cfg, **{k: v for k, v in over.items() if v is not None})
    except ConfigError:
        raise
    except TypeError as e:  # SynthConfig's own checks (__post_init__) on the flags' values
        raise ConfigError(f"{args.config or 'synth-qa'}: {e}") from None
    world = Path(args.world)
    gen = QAGenerator(KnowledgeBase.load(world), SearchSolver(_backend(world, args.index), cfg.search_max_calls),
                      cfg)
    n = write_jsonl(args.out, gen.generate(progress=not args.quiet))
    _report({"written": n, **dict(sorted(gen.summary.items()))})
    return 0


def _rubric(args) -> int:
    from searchjax.data.rubric_data import LLMRubricGenerator, generate_rubric_records
    from searchjax.rewards.rubrics import OpenAIChatClient

    writer = LLMRubricGenerator(OpenAIChatClient(args.llm_url, args.llm_model)) if args.llm_url else None
    records = generate_rubric_records(args.n, args.seed, writer=writer)
    _report({"written": write_jsonl(args.out, records)})
    return 0


def _calibrate(args) -> int:
    from searchjax.data.rubric_data import calibrate_pass_at_k, validate_rubric_record
    from searchjax.rewards.rubrics import LLMJudge, OpenAIChatClient, RuleJudge

    records, read = read_jsonl(args.inp, validate=validate_rubric_record, on_error=args.on_error)
    policy_client = OpenAIChatClient(args.policy_url, args.policy_model, temperature=args.temperature)
    judge = LLMJudge(OpenAIChatClient(args.judge_url, args.judge_model)) if args.judge_url else RuleJudge()
    kept, report = calibrate_pass_at_k(records, lambda messages, j: policy_client(messages), judge, k=args.k)
    write_jsonl(args.out, kept)
    _report({"read": read.as_dict(), **report.as_dict()})
    return 0


def _sft(args) -> int:
    from searchjax.data.rubric_data import validate_rubric_record
    from searchjax.data.sft import SFTBuilder
    from searchjax.data.synth import validate_qa_record
    from searchjax.search.world import KnowledgeBase

    world = Path(args.world)
    qa, qa_read = read_jsonl(args.qa, validate=validate_qa_record, on_error=args.on_error)
    reads = {"read_qa": qa_read.as_dict()}
    rubric = []
    if args.rubric:
        rubric, rubric_read = read_jsonl(args.rubric, validate=validate_rubric_record, on_error=args.on_error)
        reads["read_rubric"] = rubric_read.as_dict()
    builder = SFTBuilder(KnowledgeBase.load(world), _backend(world, args.index), seed=args.seed)
    n = write_jsonl(args.out, builder.build(qa, rubric, n_abstention=args.abstention))
    _report({"written": n, **reads, **dict(sorted(builder.summary.items()))})
    return 0


def _public(args) -> int:
    from searchjax.data.public import load_public_qa, quality_filter

    records, read = load_public_qa(args.format, args.inp, split=args.split, on_error=args.on_error)
    kept, rejected = quality_filter(records, max_answer_words=args.max_answer_words)
    _report({"read": read.as_dict(), "kept": write_jsonl(args.out, kept), "rejected": dict(rejected)})
    return 0


def _run(func):
    def wrapped(args) -> int:
        try:
            return func(args)
        except (DataError, ConfigError, ChatClientError, ModelReplyError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2

    return wrapped


def register(subparsers) -> None:
    data = subparsers.add_parser("data", help="build training data").add_subparsers(dest="data_command",
                                                                                   metavar="DATA_COMMAND")
    data.required = True
    p = data.add_parser("synth-qa", help="verified multi-hop QA over an offline world (RECIPE.md §3.1)")
    p.add_argument("--world", required=True, help="directory written by `searchjax world build`")
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=_count(1), help="questions to keep (before augmentation)")
    p.add_argument("--seed", type=int)
    p.add_argument("--hops", type=_hops, help="hop range, e.g. 2-4")
    p.add_argument("--index", help="tantivy index (default: WORLD/index, built if missing)")
    p.add_argument("--config", help="a SynthConfig YAML (configs/data/synth_qa.yaml)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run(_synth_qa))

    p = data.add_parser("rubric", help="rubric chat prompts with references and rubric sets (RECIPE.md §3.2)")
    p.add_argument("--n", type=_count(1), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--llm-url", help="OpenAI-compatible endpoint that writes references and rubrics "
                                     "(default: the offline template writer)")
    p.add_argument("--llm-model", default="default")
    p.set_defaults(func=_run(_rubric))

    p = data.add_parser("calibrate", help="pass@k filter of rubric prompts with a policy endpoint")
    p.add_argument("--in", dest="inp", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--policy-url", required=True, help="OpenAI-compatible endpoint serving the policy")
    p.add_argument("--policy-model", default="default")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--judge-url", help="OpenAI-compatible judge (default: the offline rule judge)")
    p.add_argument("--judge-model", default="default")
    p.add_argument("--k", type=_count(2), default=4, help="responses sampled per prompt (pass@k)")
    p.add_argument("--on-error", choices=("raise", "skip"), default="raise")
    p.set_defaults(func=_run(_calibrate))

    p = data.add_parser("sft", help="SFT trajectories and preference-style examples (RECIPE.md §1)")
    p.add_argument("--world", required=True)
    p.add_argument("--qa", required=True, help="synthetic QA JSONL from `data synth-qa`")
    p.add_argument("--out", required=True)
    p.add_argument("--rubric", help="rubric JSONL whose references become preference-style examples")
    p.add_argument("--abstention", type=_count(0), default=0, help="abstention examples to add")
    p.add_argument("--index")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--on-error", choices=("raise", "skip"), default="raise")
    p.set_defaults(func=_run(_sft))

    from searchjax.data.public import FORMATS

    p = data.add_parser("public", help="a public QA set in its published format -> unified, filtered JSONL")
    p.add_argument("--format", choices=FORMATS, required=True)
    p.add_argument("--in", dest="inp", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--split", default="train")
    p.add_argument("--max-answer-words", type=_count(1), default=20)
    p.add_argument("--on-error", choices=("raise", "skip"), default="raise")
    p.set_defaults(func=_run(_public))
