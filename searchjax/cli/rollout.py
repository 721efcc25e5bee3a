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


def _engine(args: argparse.Namespace, sampling=None):
    from searchjax.rollout import Sampling, SearchJaxEngine

    return SearchJaxEngine.from_dir(
        args.model, args.tokenizer, max_concurrent_decodes=args.slots, max_prefill_length=args.max_prefill_length,
        max_len=args.max_len, sampling=sampling or Sampling(),
    )


def summarize(records, wall_s: float) -> dict:
    """The run summary printed by `searchjax rollout` (and the demo): counts, tokens/s, tools, finish reasons."""
    policy = [r for r in records if r.model == "policy"]
    tokens = sum(r.response_length for r in records)
    return {
        "rollouts": len(policy),
        "reference_rollouts": len(records) - len(policy),
        "policy_tokens": tokens,
        "tokens_per_s": round(tokens / max(wall_s, 1e-9), 1),
        "tool_calls": sum(r.tool_calls for r in records),
        "tool_failures": sum(r.tool_failures for r in records),
        "finish_reasons": dict(collections.Counter(r.finish_reason for r in records)),
        "wall_s": round(wall_s, 2),
    }


def _rollout(args: argparse.Namespace) -> int:
    import jax
    from tqdm import tqdm

    from searchjax.data.jsonl import read_jsonl as read_rows
    from searchjax.model import load_hf
    from searchjax.rollout import AgentConfig, PromptItem, RolloutDriver, Sampling, SearchAgent, run_rollouts
    from searchjax.rollout.records import write_jsonl
    from searchjax.search import TantivyBackend

    try:
        sampling = Sampling(args.temperature, args.top_p, args.top_k)
        rows = read_rows(args.prompts)[0]
        items = [PromptItem.from_record(row, args.budget) for row in rows]
        engine = _engine(args, sampling)
        backend = TantivyBackend(args.index)
        reference = load_hf(args.reference_model)[1] if args.reference_model else None
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    driver = RolloutDriver(engine, engine.load_params())
    agent = SearchAgent(driver, backend, AgentConfig(args.budget, args.max_new_tokens, sampling))
    total = len(items) * (args.group + (1 if reference is not None else 0))
    t0 = time.perf_counter()
    # Each record is appended to OUT.partial as soon as its rollout ends, so a crash or a kill loses no finished
    # rollout; the complete file (in prompt/group order) then replaces it atomically.
    out = Path(args.out)
    partial = out.with_name(out.name + ".partial")
    with tqdm(total=total, desc="rollouts", unit="rollout", file=sys.stderr) as bar, partial.open("w") as stream:

        def on_record(record) -> None:
            stream.write(json.dumps(dataclasses.asdict(record)) + "\n")
            stream.flush()
            bar.update()

        records = run_rollouts(agent, items, args.group, jax.random.key(args.seed), reference, on_record=on_record)
    tmp = out.with_name(out.name + ".tmp")
    write_jsonl(records, tmp)
    os.replace(tmp, out)
    partial.unlink()
    print(json.dumps(summarize(records, time.perf_counter() - t0)))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from searchjax.rollout import Sampling
    from searchjax.rollout.serve import RolloutServer

    try:
        server = RolloutServer(_engine(args, Sampling(args.temperature, args.top_p, args.top_k)), args.host, args.port)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"serving {args.model} (JetStream Decode) on {args.host}:{server.port}", flush=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop()
    return 0


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="HF checkpoint directory (config.json + safetensors)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the one in --model)")
    p.add_argument("--slots", type=int, default=32, help="concurrent decodes (default 32)")
    p.add_argument("--max-len", type=int, default=4096, help="cache positions per slot (default 4096)")
    p.add_argument("--max-prefill-length", type=int, default=512, help="longest single prefill (default 512)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0 = off)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")


def register(subparsers) -> None:
    p = subparsers.add_parser("rollout", help="search-agent rollouts (G per prompt) to a JSONL of records")
    _engine_args(p)
    p.add_argument("--index", required=True, help="tantivy index directory for search_web")
    p.add_argument("--prompts", required=True, help="QA JSONL ({id, question, answer, ...} per line)")
    p.add_argument("--group", type=int, required=True, help="rollouts per prompt (G)")
    p.add_argument("--budget", type=int, required=True, help="search_web calls per rollout (b)")
    p.add_argument("--max-new-tokens", type=int, required=True, help="policy tokens per rollout, all turns")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--reference-model", default=None, help="also one rollout per prompt with these weights")
    p.add_argument("--out", required=True, help="output JSONL of rollout records")
    p.set_defaults(func=_rollout)

    s = subparsers.add_parser("serve", help="JetStream Decode gRPC service with the model (127.0.0.1 by default)")
    _engine_args(s)
    s.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: loopback only)")
    s.add_argument("--port", type=int, default=9000)
    s.set_defaults(func=_serve)
