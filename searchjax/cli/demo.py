"""`searchjax demo`: the main job on the embedded default — the whole pipeline on tiny models, offline, on a CPU.

Stages (each a library call; artefacts go to --out, default runs/demo):
  1. world      an offline world (fictional entities + real facts from PyPI packages) -> corpus.jsonl, kb.jsonl
  2. index      a tantivy BM25 index of the corpus (the search_web backend)
  3. tokenizer  a byte-level BPE with the Qwen3.5 special tokens, trained on the corpus
  4. data       verified multi-hop questions by sequential expansion (KB solver + search-only solver agree)
  5. model      the tiny Qwen3.5 MoE preset, randomly initialised, saved and reloaded in HF format; a forward pass
                and a batched greedy decode with the hybrid cache
  6. rollouts   G search-agent rollouts per question through the JetStream engine and the RL driver, plus one
                reference-model rollout per question; records (tokens, loss mask, μ_infer) to JSONL
  7. rewards    r_base by answer matching and the anchored tool penalty of RECIPE.md §4 on those records

The policy is untrained, so its answers are noise: the demo shows every stage working end to end, with timings.
The preference score s(τ) needs the Bradley–Terry reward model, which is not part of the pipeline yet, so the
gated reward R = r_base·s − pen_eff and the length penalty (which reads s) are not computed here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path


def _stage(name: str):
    """Print a stage header; returns a function that prints its closing line with the elapsed time."""
    print(f"[{name}]", flush=True)
    t0 = time.perf_counter()
    return lambda msg: print(f"  {msg} ({time.perf_counter() - t0:.1f} s)", flush=True)


def build_world_and_index(out: Path, seed: int, n_docs: int) -> None:
    from searchjax.search import build_index
    from searchjax.search.world import build_world

    done = _stage("1 world")
    manifest = build_world(out / "world", seed=seed, n_docs=n_docs, n_real_cities=100, progress=False)
    done(f"{manifest['num_docs']:,} documents, {manifest['num_entities']:,} entities, "
         f"{manifest['num_relations']:,} relations -> {out / 'world'}")
    done = _stage("2 index")
    n = build_index(out / "world" / "corpus.jsonl", out / "index", progress=False)
    done(f"tantivy BM25 index of {n:,} documents -> {out / 'index'}")


def train_demo_tokenizer(out: Path, vocab_size: int):
    from searchjax.chat import train_tokenizer

    done = _stage("3 tokenizer")
    tok = train_tokenizer([out / "world" / "corpus.jsonl"], vocab_size, out / "tokenizer.json")
    done(f"byte-level BPE, {tok.vocab_size:,} ids incl. the Qwen3.5 special tokens -> {out / 'tokenizer.json'}")
    return tok


def synth_questions(out: Path, seed: int, n: int) -> list[dict]:
    from searchjax.data.jsonl import write_jsonl
    from searchjax.data.solvers import SearchSolver
    from searchjax.data.synth import QAGenerator, SynthConfig
    from searchjax.search import TantivyBackend
    from searchjax.search.world import KnowledgeBase

    done = _stage("4 data")
    gen = QAGenerator(KnowledgeBase.load(out / "world"), SearchSolver(TantivyBackend(out / "index")),
                      SynthConfig(n=n, seed=seed, augment_fraction=0.0))
    rows = list(gen.generate())
    write_jsonl(out / "qa.jsonl", rows)
    rejected = {k.split(":", 1)[1]: v for k, v in gen.summary.items() if k.startswith("rejected:")}
    done(f"{len(rows)} verified questions (hops {sorted({r['hops'] for r in rows})}), rejected on the way: "
         f"{rejected} -> {out / 'qa.jsonl'}")
    if rows:
        print(f"  e.g. {rows[0]['question']!r} -> {rows[0]['answer']!r}")
    return rows


def model_stage(out: Path, preset: str, seed: int, tok, batch: int, prompt_len: int, new_tokens: int):
    """A random checkpoint of `preset` (vocab = the tokenizer's) through save_hf/load_hf; forward + greedy decode."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from searchjax.model import forward, init_params, load_hf, load_preset, param_count, save_hf
    from searchjax.model.generate import greedy_generate

    done = _stage("5 model")
    cfg = load_preset(preset).replace(vocab_size=tok.vocab_size)
    save_hf(out / "model", init_params(cfg, jax.random.key(seed)), cfg)
    shutil.copyfile(out / "tokenizer.json", out / "model" / "tokenizer.json")
    cfg, params = load_hf(out / "model")
    done(f"preset {preset!r}: {param_count(cfg):,} parameters ({param_count(cfg, active=True):,} active), "
         f"saved and reloaded in HF format -> {out / 'model'}")
    prompts = jax.random.randint(jax.random.key(seed + 1), (batch, prompt_len), 0, cfg.vocab_size, jnp.int32)
    lengths = jnp.asarray(np.linspace(prompt_len, max(1, prompt_len // 2), batch).astype(np.int32))
    jax.block_until_ready(forward(params, prompts, cfg))  # compile
    t0 = time.perf_counter()
    logits = jax.block_until_ready(forward(params, prompts, cfg))
    dt = time.perf_counter() - t0
    print(f"  forward: {batch}x{prompt_len} tokens -> logits {tuple(logits.shape)}, {batch * prompt_len / dt:,.0f} "
          "tokens/s")
    greedy_generate(params, cfg, prompts, lengths, new_tokens).block_until_ready()  # compile
    t0 = time.perf_counter()
    greedy_generate(params, cfg, prompts, lengths, new_tokens).block_until_ready()
    dt = time.perf_counter() - t0
    print(f"  greedy decode: batch {batch}, prompt lengths {np.asarray(lengths).tolist()}, {new_tokens} new tokens "
          f"per row, {batch * new_tokens / dt:,.0f} tokens/s (prefill included)")
    return cfg, params


def rollout_stage(out: Path, questions: list[dict], params, args: argparse.Namespace) -> list:
    import jax

    from searchjax.cli.rollout import summarize
    from searchjax.rollout import (AgentConfig, PromptItem, RolloutDriver, Sampling, SearchAgent, SearchJaxEngine,
                                   run_rollouts, write_jsonl)
    from searchjax.search import TantivyBackend

    done = _stage("6 rollouts")
    sampling = Sampling(args.temperature)
    engine = SearchJaxEngine.from_dir(str(out / "model"), max_concurrent_decodes=args.slots, max_len=args.max_len,
                                      max_prefill_length=512, sampling=sampling)
    agent = SearchAgent(RolloutDriver(engine, engine.load_params()), TantivyBackend(out / "index"),
                        AgentConfig(args.budget, args.max_new_tokens, sampling))
    items = [PromptItem.from_record(q, args.budget) for q in questions]
    t0 = time.perf_counter()
    # The reference model is the starting policy itself here (RL has not moved it yet).
    records = run_rollouts(agent, items, args.group, jax.random.key(args.seed), reference_params=params)
    wall = time.perf_counter() - t0
    write_jsonl(records, out / "rollouts.jsonl")
    stats = summarize(records, wall)
    done(f"{len(records)} rollouts ({len(items)} questions x G={args.group} + 1 reference each), "
         f"{stats['policy_tokens']:,} policy tokens, {stats['tokens_per_s']:,.0f} tokens/s, {stats['tool_calls']} "
         f"search_web calls ({stats['tool_failures']} failed), finish reasons {stats['finish_reasons']} -> "
         f"{out / 'rollouts.jsonl'}")
    return records


def reward_stage(questions: list[dict], records: list, seed: int) -> None:
    """r_base by answer matching and the anchored tool penalty (RECIPE.md §4) over the [N, G] policy rollouts."""
    import jax
    import numpy as np

    from searchjax.rewards import RewardConfig, answer_correct, tool_penalty

    done = _stage("7 rewards")
    by_id = {q["id"]: q for q in questions}
    policy = [r for r in records if r.model == "policy"]
    ids = sorted({r.prompt_id for r in policy})
    g = 1 + max(r.group_index for r in policy)
    correct, calls, failures, mask = (np.zeros((len(ids), g), np.float32) for _ in range(4))
    for r in policy:
        i, j = ids.index(r.prompt_id), r.group_index
        gold = by_id[r.prompt_id]
        correct[i, j] = answer_correct(r.answer, [gold["answer"], *gold["aliases"]])
        calls[i, j], failures[i, j], mask[i, j] = r.tool_calls, r.tool_failures, 1
    cfg = RewardConfig()
    pen = tool_penalty(calls, failures, correct, key=jax.random.key(seed), alpha_win=cfg.alpha_win,
                       alpha_lose=cfg.alpha_lose, beta_lose=cfg.beta_lose, mask=mask > 0)
    done(f"r_base (answer matches gold or an alias): {correct.sum():.0f}/{mask.sum():.0f} correct; anchored tool "
         f"penalty pen_tool mean {float(np.asarray(pen)[mask > 0].mean()):.3f} (alpha_win={cfg.alpha_win}, "
         f"alpha_lose={cfg.alpha_lose}, beta_lose={cfg.beta_lose})")
    print("  (the preference score s needs the Bradley-Terry reward model, not in the pipeline yet: the gated "
          "reward R = r_base*s - pen_eff and the length penalty are not computed)")


def run_demo(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        print(f"error: {out} exists and is not empty (pass --overwrite to replace it)", file=sys.stderr)
        return 1
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    build_world_and_index(out, args.seed, args.docs)
    tok = train_demo_tokenizer(out, args.vocab_size)
    questions = synth_questions(out, args.seed, args.questions)
    if not questions:
        print("error: no verified question was generated; try a larger --docs", file=sys.stderr)
        return 1
    _, params = model_stage(out, args.preset, args.seed, tok, batch=4, prompt_len=16, new_tokens=16)
    records = rollout_stage(out, questions, params, args)
    reward_stage(questions, records, args.seed)
    print(f"demo: done in {time.perf_counter() - t0:.0f} s; artefacts in {out}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="run the main job on the embedded default (tiny model, offline, CPU)")
    p.add_argument("--out", default="runs/demo", help="artefact directory (default runs/demo)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it is not empty")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--docs", type=int, default=3000, help="world size in documents")
    p.add_argument("--vocab-size", type=int, default=2048, help="tokenizer vocabulary (= the model's)")
    p.add_argument("--questions", type=int, default=6, help="verified multi-hop questions to generate")
    p.add_argument("--group", type=int, default=4, help="rollouts per question (G)")
    p.add_argument("--budget", type=int, default=2, help="search_web calls per rollout")
    p.add_argument("--max-new-tokens", type=int, default=48, help="policy tokens per rollout")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--slots", type=int, default=8, help="concurrent decodes in the engine")
    p.add_argument("--max-len", type=int, default=4096, help="cache positions per slot")
    p.set_defaults(func=run_demo)
