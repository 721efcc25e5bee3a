"""CLI: `searchjax rollout` (search-agent rollouts to JSONL) and `searchjax serve` (JetStream Decode over gRPC)."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from searchjax.cli.common import (CLIError, INDEX_HELP, add_overwrite, check_input_dir, check_input_file,
                                  check_output, check_port, float_in, int_at_least, non_negative_int,
                                  open_search_backend, positive_int, run_command, show_progress)


def _model_dir(path: str, flag: str) -> Path:
    return check_input_dir(path, flag, needs=("config.json",))


def _tokenizer_path(args: argparse.Namespace) -> Path:
    """The tokenizer.json the engine will read: --tokenizer, else the one in --model."""
    if args.tokenizer:
        return check_input_file(args.tokenizer, "--tokenizer")
    path = Path(args.model) / "tokenizer.json"
    if not path.is_file():
        raise CLIError(f"--model {args.model}: no tokenizer.json (pass --tokenizer FILE)")
    return path


def _engine(args: argparse.Namespace, sampling=None):
    from searchjax.rollout import Sampling, SearchJaxEngine

    return SearchJaxEngine.from_dir(
        args.model, args.tokenizer, max_concurrent_decodes=args.slots, max_prefill_length=args.max_prefill_length,
        max_len=args.max_len, sampling=sampling or Sampling(),
    )


def summarize(records, wall_s: float, compile_s: float | None = None) -> dict:
    """The run summary printed by `searchjax rollout` (and the demo): counts, tokens/s, tools, finish reasons.

    `wall_s` is the rollouts' time without the warm-up compile (`compile_s`, reported apart), so tokens/s is the
    decoding rate; kernels first needed mid-run (a new prefill length) still count in it.
    """
    policy = [r for r in records if r.model == "policy"]
    tokens = sum(r.response_length for r in records)
    summary = {
        "rollouts": len(policy),
        "reference_rollouts": len(records) - len(policy),
        "policy_tokens": tokens,
        "tokens_per_s": round(tokens / max(wall_s, 1e-9), 1),
        "tool_calls": sum(r.tool_calls for r in records),
        "tool_failures": sum(r.tool_failures for r in records),
        "finish_reasons": dict(collections.Counter(r.finish_reason for r in records)),
        "wall_s": round(wall_s, 2),
    }
    if compile_s is not None:
        summary["compile_s"] = round(compile_s, 2)
    return summary


def _prompt_record(row: dict) -> None:
    """A prompt row: an id and a question (a QA record) or messages (a rubric record)."""
    from searchjax.data.jsonl import require

    require(row, "id", (str, int))
    if "messages" in row:
        require(row, "messages", list)
    else:
        require(row, "question", str)


def read_prompts(path: str, budget: int) -> list:
    """PromptItems of a prompts JSONL; DataError naming file:line for a bad row, CLIError when it has none."""
    from searchjax.data.jsonl import read_jsonl
    from searchjax.rollout import PromptItem

    rows = read_jsonl(check_input_file(path, "--prompts"), validate=_prompt_record)[0]
    if not rows:
        raise CLIError(f"--prompts {path}: no prompt in the file")
    return [PromptItem.from_record(row, budget) for row in rows]


def check_prompt_lengths(agent, items, max_len: int) -> list:
    """Warn for each prompt that leaves no room to generate under max_len; CLIError when none leaves any.
    Returns the prompts that fit."""
    fits = []
    for item in items:
        n = len(agent.prompt_ids(item))
        if n >= max_len:
            print(f"warning: prompt {item.prompt_id!r} has {n} tokens, which fill --max-len {max_len}: its "
                  "rollouts can generate nothing", file=sys.stderr)
        else:
            fits.append(item)
    if not fits:
        raise CLIError(f"none of the {len(items)} prompts fits --max-len {max_len} with room to generate; "
                       "raise --max-len")
    return fits


def warm_up(agent, item, sampling) -> float:
    """Compile the engine's kernels on one short request (`item`'s prompt, 2 new tokens) before the timed run,
    announcing it, so the progress bar does not sit at 0% and tokens/s leaves compile time out. Returns its s."""
    import jax

    from searchjax.rollout import Request

    print("compiling the engine's kernels (first prefill and decode step; tens of seconds on a CPU) ...",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    agent.driver.run([Request(tuple(agent.prompt_ids(item)), 2, jax.random.key(0), sampling)])
    seconds = time.perf_counter() - t0
    print(f"compiled in {seconds:.1f} s", file=sys.stderr, flush=True)
    return seconds


def check_generated(records) -> None:
    """CLIError when the rollouts produced no policy token at all (an output of no use for training)."""
    if records and not any(r.response_length for r in records):
        reasons = dict(collections.Counter(r.finish_reason for r in records))
        raise CLIError(f"the {len(records)} rollouts generated no policy token (finish reasons {reasons})")


@run_command
def _rollout(args: argparse.Namespace) -> int:
    from searchjax.rollout import Sampling

    # Everything that can be checked without the model is checked first: flags, paths, prompts, the index.
    sampling = Sampling(args.temperature, args.top_p, args.top_k)
    out = check_output(args.out, args.overwrite)
    _model_dir(args.model, "--model")
    _tokenizer_path(args)
    if args.reference_model:
        _model_dir(args.reference_model, "--reference-model")
    items = read_prompts(args.prompts, args.budget)
    backend = open_search_backend(args.index)

    from searchjax.model import load_hf
    from searchjax.rollout import AgentConfig, RolloutDriver, SearchAgent

    engine = _engine(args, sampling)
    reference = load_hf(args.reference_model)[1] if args.reference_model else None
    driver = RolloutDriver(engine, engine.load_params())
    agent = SearchAgent(driver, backend, AgentConfig(args.budget, args.max_new_tokens, sampling))
    fitting = check_prompt_lengths(agent, items, args.max_len)
    compile_s = warm_up(agent, fitting[0], sampling)
    t0 = time.perf_counter()
    records = _run_streaming(agent, items, args, reference, out)
    print(json.dumps(summarize(records, time.perf_counter() - t0, compile_s)))
    return 0


def _run_streaming(agent, items, args: argparse.Namespace, reference, out: Path) -> list:
    """Run the rollouts, appending each finished record to OUT.partial (so a crash or a kill loses no finished
    rollout), then write OUT whole (in prompt/group order, atomically) and remove OUT.partial."""
    import jax
    from tqdm import tqdm

    import searchjax.rollout as rollout_pkg
    from searchjax.rollout.records import write_jsonl

    total = len(items) * (args.group + (1 if reference is not None else 0))
    partial = out.with_name(out.name + ".partial")
    finished = 0
    try:
        with tqdm(total=total, desc="rollouts", unit="rollout", file=sys.stderr,
                  disable=not show_progress()) as bar, partial.open("w") as stream:

            def on_record(record) -> None:
                nonlocal finished
                stream.write(json.dumps(dataclasses.asdict(record)) + "\n")
                stream.flush()
                finished += 1
                bar.update()

            records = rollout_pkg.run_rollouts(agent, items, args.group, jax.random.key(args.seed), reference,
                                               on_record=on_record)
        check_generated(records)
        write_jsonl(records, out)
    except BaseException as e:
        if finished and not isinstance(e, CLIError):
            print(f"note: the {finished} rollouts that finished are kept in {partial}", file=sys.stderr)
        else:
            partial.unlink(missing_ok=True)
        raise
    partial.unlink()
    return records


@run_command
def _serve(args: argparse.Namespace) -> int:
    from searchjax.rollout import Sampling
    from searchjax.rollout.serve import STOP_TIMEOUT_S, RolloutServer

    sampling = Sampling(args.temperature, args.top_p, args.top_k)
    _model_dir(args.model, "--model")
    _tokenizer_path(args)
    server = RolloutServer(_engine(args, sampling), args.host, args.port)
    print(f"serving {args.model} (JetStream Decode) on {args.host}:{server.port}", flush=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        stuck = server.stop()
        if stuck:  # daemon threads end with the process; the RPC workers would be joined at exit: leave now
            print(f"searchjax serve: {', '.join(stuck)} did not stop within {STOP_TIMEOUT_S:.0f} s; exiting without "
                  "waiting for them", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(0)
    return 0


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="HF checkpoint directory (config.json + safetensors)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the one in --model)")
    p.add_argument("--slots", type=positive_int, default=32, help="concurrent decodes")
    p.add_argument("--max-len", type=positive_int, default=4096, help="cache positions per slot (prompt + turns)")
    p.add_argument("--max-prefill-length", type=positive_int, default=512,
                   help="longest single prefill, a JetStream bucket (16, 32, ..., 512, 1024, ...)")
    p.add_argument("--temperature", type=float_in(0.0, float("inf")), default=1.0,
                   help="sampling temperature (0 = greedy)")
    p.add_argument("--top-p", type=float_in(0.0, 1.0, lo_open=True), default=1.0,
                   help="nucleus sampling mass (1.0 = off)")
    p.add_argument("--top-k", type=non_negative_int, default=0, help="keep the k most likely tokens (0 = off)")


def register(subparsers) -> None:
    p = subparsers.add_parser("rollout", help="search-agent rollouts (G per prompt) to a JSONL of records")
    _engine_args(p)
    p.add_argument("--index", required=True, help=INDEX_HELP)
    p.add_argument("--prompts", required=True, help="QA JSONL ({id, question, answer, ...} per line)")
    p.add_argument("--group", type=positive_int, required=True, help="rollouts per prompt (G)")
    p.add_argument("--budget", type=non_negative_int, required=True, help="search_web calls per rollout (b)")
    p.add_argument("--max-new-tokens", type=int_at_least(1), required=True,
                   help="policy tokens per rollout, all turns")
    p.add_argument("--seed", type=int, required=True, help="PRNG seed of the rollouts")
    p.add_argument("--reference-model", default=None, help="also one rollout per prompt with these weights")
    p.add_argument("--out", required=True, help="output JSONL of rollout records")
    add_overwrite(p)
    p.set_defaults(func=_rollout)

    s = subparsers.add_parser("serve", help="JetStream Decode gRPC service with the model (127.0.0.1 by default)")
    _engine_args(s)
    s.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1: loopback only)")
    s.add_argument("--port", type=check_port, default=9000, help="TCP port (0 picks a free one)")
    s.set_defaults(func=_serve)
