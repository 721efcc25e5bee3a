"""`searchjax data ...`: synthetic QA, rubric chat data and its pass@4 calibration, SFT data, public QA sets."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from searchjax.cli.common import (CLIError, INDEX_HELP, add_overwrite, check_input_dir, check_input_file,
                                  check_output, float_in, int_at_least, open_search_backend, run_command,
                                  show_progress)
from searchjax.config import ConfigError, load_yaml
from searchjax.data.jsonl import check_fields, read_jsonl, write_jsonl

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


def _report(summary: dict) -> None:
    print(json.dumps(summary, indent=1, sort_keys=True), file=sys.stderr)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _finish(out: Path, rows: list[dict], what: str, summary: dict, count_key: str = "written") -> int:
    """Write `rows` to `out` atomically and print `summary` with the count on stderr. No rows is an error (an
    empty training file is of no use): the summary is printed, to say why, and `out` is left as it was."""
    if not rows:
        _report(summary)
        raise CLIError(f"no {what} to write; {out} was left as it was")
    _report({count_key: write_jsonl(out, rows), **summary})
    return 0


def _world(path: str) -> Path:
    """A world directory whose kb.jsonl and corpus.jsonl exist and are not empty."""
    from searchjax.search.world.kb import CORPUS_FILE, KB_FILE

    world = check_input_dir(path, "--world", needs=(KB_FILE, CORPUS_FILE))
    for name in (KB_FILE, CORPUS_FILE):
        with (world / name).open("rb") as f:
            if not any(line.strip() for line in f):
                raise CLIError(f"--world {world}: {name} is empty; rebuild it with `searchjax world build`")
    return world


def _load_kb(world: Path):
    from searchjax.search.world import KnowledgeBase

    kb = KnowledgeBase.load(world)
    if not kb.entities:
        raise CLIError(f"--world {world}: kb.jsonl holds no entity; rebuild it with `searchjax world build`")
    return kb


def _backend(world: Path, index: str | None):
    from searchjax.search import TantivyBackend, build_index

    if index:
        return open_search_backend(index)
    index_dir = world / "index"
    if not index_dir.exists():
        print(f"building the index of {world / 'corpus.jsonl'} into {index_dir}", file=sys.stderr)
        build_index(world / "corpus.jsonl", index_dir, progress=show_progress())
    return TantivyBackend(index_dir)


def _qa_record(row: dict) -> None:
    """validate_qa_record, after naming exactly which fields are missing or unexpected."""
    from searchjax.data.synth import RECORD_FIELDS, validate_qa_record

    check_fields(row, RECORD_FIELDS)
    validate_qa_record(row)


@run_command
def _synth_qa(args) -> int:
    from searchjax.data.solvers import SearchSolver
    from searchjax.data.synth import QAGenerator, SynthConfig

    out = check_output(args.out, args.overwrite)
    world = _world(args.world)
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
    kb = _load_kb(world)
    gen = QAGenerator(kb, SearchSolver(_backend(world, args.index), cfg.search_max_calls), cfg)
    rows = list(gen.generate(progress=show_progress() and not args.quiet))
    summary = dict(sorted(gen.summary.items()))
    if summary.get("kept", 0) < cfg.n:
        _warn(f"kept {summary.get('kept', 0)} verified questions of the {cfg.n} asked (see the rejections below)")
    return _finish(out, rows, "verified question", summary)


@run_command
def _rubric(args) -> int:
    from searchjax.data.rubric_data import LLMRubricGenerator, generate_rubric_records
    from searchjax.rewards.rubrics import OpenAIChatClient

    out = check_output(args.out, args.overwrite)
    writer = LLMRubricGenerator(OpenAIChatClient(args.llm_url, args.llm_model)) if args.llm_url else None
    records = list(generate_rubric_records(args.n, args.seed, writer=writer))
    return _finish(out, records, "rubric record", {})


@run_command
def _calibrate(args) -> int:
    from searchjax.data.rubric_data import calibrate_pass_at_k, validate_rubric_record
    from searchjax.rewards.rubrics import LLMJudge, OpenAIChatClient, RuleJudge

    out = check_output(args.out, args.overwrite)
    records, read = read_jsonl(check_input_file(args.inp, "--in"), validate=validate_rubric_record,
                               on_error=args.on_error)
    if not records:
        raise CLIError(f"--in {args.inp}: no rubric record to calibrate")
    policy_client = OpenAIChatClient(args.policy_url, args.policy_model, temperature=args.temperature)
    judge = LLMJudge(OpenAIChatClient(args.judge_url, args.judge_model)) if args.judge_url else RuleJudge()
    kept, report = calibrate_pass_at_k(records, lambda messages, j: policy_client(messages), judge, k=args.k)
    return _finish(out, list(kept), "prompt that passed the pass@k filter",
                   {"read": read.as_dict(), **report.as_dict()})


@run_command
def _sft(args) -> int:
    from searchjax.data.rubric_data import validate_rubric_record
    from searchjax.data.sft import SFTBuilder

    out = check_output(args.out, args.overwrite)
    world = _world(args.world)
    qa, qa_read = read_jsonl(check_input_file(args.qa, "--qa"), validate=_qa_record, on_error=args.on_error)
    if not qa:
        _warn(f"--qa {args.qa} holds no QA record: no search trajectory will be written")
    reads = {"read_qa": qa_read.as_dict()}
    rubric = []
    if args.rubric:
        rubric, rubric_read = read_jsonl(check_input_file(args.rubric, "--rubric"), validate=validate_rubric_record,
                                         on_error=args.on_error)
        reads["read_rubric"] = rubric_read.as_dict()
    builder = SFTBuilder(_load_kb(world), _backend(world, args.index), seed=args.seed, max_results=args.results,
                         thoughts=args.thoughts, recovery=args.recovery)
    rows = list(builder.build(qa, rubric, n_abstention=args.abstention))
    return _finish(out, rows, "SFT example", {**reads, **dict(sorted(builder.summary.items()))})


@run_command
def _public(args) -> int:
    from searchjax.data.public import load_public_qa, quality_filter

    out = check_output(args.out, args.overwrite)
    records, read = load_public_qa(args.format, check_input_file(args.inp, "--in"), split=args.split,
                                   on_error=args.on_error)
    kept, rejected = quality_filter(records, max_answer_words=args.max_answer_words)
    return _finish(out, list(kept), "record that passed the quality filter",
                   {"read": read.as_dict(), "rejected": dict(rejected)}, count_key="kept")


def _public_formats() -> str:
    """The "Formats" block of searchjax.data.public's docstring, for `data public --help`."""
    from searchjax.data import public

    doc = public.__doc__
    block = doc[doc.index("Formats"):].split("\n\n", 1)[0]
    return block + "\n\nOutput: one unified record a line {id, kind, question, answer, aliases, source, split, meta}."


def _on_error(p: argparse.ArgumentParser) -> None:
    p.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                   help="a malformed input row stops the command (raise) or is skipped and counted (skip)")


def register(subparsers) -> None:
    from searchjax.data.sft import THOUGHT_STYLES

    data = subparsers.add_parser("data", help="build training data").add_subparsers(dest="data_command",
                                                                                   metavar="DATA_COMMAND")
    data.required = True
    p = data.add_parser("synth-qa", help="verified multi-hop QA over an offline world (RECIPE.md §3.1)")
    p.add_argument("--world", required=True, help="directory written by `searchjax world build`")
    p.add_argument("--out", required=True, help="output QA JSONL")
    p.add_argument("--n", type=int_at_least(1), help="questions to keep before augmentation (default: the config's)")
    p.add_argument("--seed", type=int, help="PRNG seed (default: the config's)")
    p.add_argument("--hops", type=_hops, help="hop range, e.g. 2-4 (default: the config's)")
    p.add_argument("--index", help=INDEX_HELP + " (default: WORLD/index, built if missing)")
    p.add_argument("--config", help="a SynthConfig YAML (configs/data/synth_qa.yaml)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_overwrite(p)
    p.set_defaults(func=_synth_qa)

    p = data.add_parser("rubric", help="rubric chat prompts with references and rubric sets (RECIPE.md §3.2)")
    p.add_argument("--n", type=int_at_least(1), required=True, help="rubric prompts to write")
    p.add_argument("--out", required=True, help="output rubric JSONL")
    p.add_argument("--seed", type=int, default=0, help="PRNG seed")
    p.add_argument("--llm-url", help="OpenAI-compatible endpoint that writes references and rubrics "
                                     "(default: the offline template writer)")
    p.add_argument("--llm-model", default="default", help="model name sent to --llm-url")
    add_overwrite(p)
    p.set_defaults(func=_rubric)

    p = data.add_parser("calibrate", help="pass@k filter of rubric prompts with a policy endpoint")
    p.add_argument("--in", dest="inp", required=True, help="rubric JSONL from `data rubric`")
    p.add_argument("--out", required=True, help="output JSONL of the prompts that pass")
    p.add_argument("--policy-url", required=True, help="OpenAI-compatible endpoint serving the policy")
    p.add_argument("--policy-model", default="default", help="model name sent to --policy-url")
    p.add_argument("--temperature", type=float, default=1.0, help="policy sampling temperature")
    p.add_argument("--judge-url", help="OpenAI-compatible judge (default: the offline rule judge)")
    p.add_argument("--judge-model", default="default", help="model name sent to --judge-url")
    p.add_argument("--k", type=int_at_least(2), default=4, help="responses sampled per prompt (pass@k)")
    _on_error(p)
    add_overwrite(p)
    p.set_defaults(func=_calibrate)

    p = data.add_parser("sft", help="SFT trajectories and preference-style examples (RECIPE.md §1)")
    p.add_argument("--world", required=True, help="directory written by `searchjax world build`")
    p.add_argument("--qa", required=True, help="synthetic QA JSONL from `data synth-qa`")
    p.add_argument("--out", required=True, help="output SFT JSONL")
    p.add_argument("--rubric", help="rubric JSONL whose references become preference-style examples")
    p.add_argument("--abstention", type=int_at_least(0), default=0, help="abstention examples to add")
    p.add_argument("--results", type=int_at_least(1), default=10,
                   help="search results each call shows (1..10; the rollouts of the policy must show as many)")
    p.add_argument("--thoughts", choices=THOUGHT_STYLES, default="plain",
                   help="the expert's thinking: plain (\"I need X, so I will search for it.\"), rewrite (each "
                        "turn also states the question left, with the entities found so far substituted in: "
                        "searchjax.data.sft.rewrite_thoughts) or found (rewrite, after a sentence saying what the "
                        "last search found: \"X is the organisation founded in 2008.\")")
    p.add_argument("--recovery", type=float_in(0.0, 1.0), default=0.0,
                   help="share of the trajectories that first make one call malformed (no loss on it), get the "
                        "agent's error response and then make the expert's call (searchjax.data.sft.with_recovery)")
    p.add_argument("--index", help=INDEX_HELP + " (default: WORLD/index, built if missing)")
    p.add_argument("--seed", type=int, default=0, help="PRNG seed")
    _on_error(p)
    add_overwrite(p)
    p.set_defaults(func=_sft)

    from searchjax.data.public import FORMATS

    p = data.add_parser("public", help="a public QA set in its published format -> unified, filtered JSONL",
                        epilog=_public_formats())
    p.add_argument("--format", choices=FORMATS, required=True, help="the set's published format (see below)")
    p.add_argument("--in", dest="inp", required=True, help="the published file (CSV, TSV, Parquet, JSONL or JSON)")
    p.add_argument("--out", required=True, help="output unified QA JSONL")
    p.add_argument("--split", default="train", help="split name written into every record")
    p.add_argument("--max-answer-words", type=int_at_least(1), default=20,
                   help="quality filter: drop answers longer than this")
    _on_error(p)
    add_overwrite(p)
    p.set_defaults(func=_public)

    from searchjax.cli.reward_model import add_preferences_command

    add_preferences_command(data)
