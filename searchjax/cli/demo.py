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

The artefacts are built in a temporary sibling of --out and moved into place at the end (an existing --out is
replaced whole with --overwrite, else refused), with summary.json (every stage's figures) and a README.md
describing each artefact.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from searchjax.cli.common import (CLIError, add_overwrite, check_output, int_at_least, non_negative_int, positive_int,
                                  run_command, show_progress)

# What each artefact of the demo directory is, for its README.md.
ARTEFACTS = {
    "world/corpus.jsonl": "the offline world's documents, one {id, about, title, url, text} object a line",
    "world/kb.jsonl": "its knowledge base: entities and relations, each naming the documents that state it",
    "world/world.json": "the world's manifest: config, counts (real-facts and fictional documents), sources",
    "index/": "the tantivy BM25 index of the corpus (`searchjax search --index index/ QUERY`)",
    "qa.jsonl": "verified multi-hop questions {id, question, answer, aliases, hops, chain, ...}",
    "model/": "the tiny Qwen3.5 MoE checkpoint in HF format (config.json, model.safetensors) with the trained "
              "byte-level BPE tokenizer.json (`searchjax model info model/`)",
    "rollouts.jsonl": "one rollout record a line: token ids, loss mask and μ_infer log-probs for training, with "
                      "the rollout's answer, tool calls and finish reason",
    "summary.json": "every stage's figures, as printed",
}


def _stage(name: str):
    """Print a stage header; returns a function that prints its closing line with the elapsed time."""
    print(f"[{name}]", flush=True)
    t0 = time.perf_counter()
    return lambda msg: print(f"  {msg} ({time.perf_counter() - t0:.1f} s)", flush=True)


def build_world_and_index(out: Path, seed: int, n_docs: int) -> dict:
    from searchjax.search import build_index
    from searchjax.search.world import build_world

    done = _stage("1 world")
    manifest = build_world(out / "world", seed=seed, n_docs=n_docs, n_real_cities=100, progress=False)
    done(f"{manifest['num_docs']:,} documents ({manifest['num_docs_fictional']:,} fictional + "
         f"{manifest['num_docs_real']:,} real-facts), {manifest['num_entities']:,} entities, "
         f"{manifest['num_relations']:,} relations -> world/")
    done = _stage("2 index")
    n = build_index(out / "world" / "corpus.jsonl", out / "index", progress=False)
    done(f"tantivy BM25 index of {n:,} documents -> index/")
    world = {k: manifest[k] for k in ("num_docs", "num_docs_real", "num_docs_fictional", "num_entities",
                                      "num_relations")}
    return {"world": world, "index": {"num_docs": n}}


def train_demo_tokenizer(out: Path, vocab_size: int):
    from searchjax.chat import train_tokenizer

    done = _stage("3 tokenizer")
    (out / "model").mkdir()
    tok = train_tokenizer([out / "world" / "corpus.jsonl"], vocab_size, out / "model" / "tokenizer.json")
    done(f"byte-level BPE, {tok.vocab_size:,} ids incl. the Qwen3.5 special tokens -> model/tokenizer.json")
    return tok


def synth_questions(out: Path, seed: int, n: int) -> tuple[list[dict], dict]:
    from searchjax.data.jsonl import write_jsonl
    from searchjax.data.solvers import SearchSolver
    from searchjax.data.synth import QAGenerator, SynthConfig
    from searchjax.search import TantivyBackend
    from searchjax.search.world import KnowledgeBase

    done = _stage("4 data")
    gen = QAGenerator(KnowledgeBase.load(out / "world"), SearchSolver(TantivyBackend(out / "index")),
                      SynthConfig(n=n, seed=seed, augment_fraction=0.0))
    rows = list(gen.generate())
    if rows:
        write_jsonl(out / "qa.jsonl", rows)
    rejected = {k.split(":", 1)[1]: v for k, v in gen.summary.items() if k.startswith("rejected:")}
    done(f"{len(rows)} verified questions (hops {sorted({r['hops'] for r in rows})}), rejected on the way: "
         f"{rejected} -> qa.jsonl")
    if rows:
        print(f"  e.g. {rows[0]['question']!r} -> {rows[0]['answer']!r}")
    return rows, {"questions": len(rows), "asked": n, "rejected": rejected}


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
    cfg, params = load_hf(out / "model")
    done(f"preset {preset!r}: {param_count(cfg):,} parameters ({param_count(cfg, active=True):,} active), "
         "saved and reloaded in HF format -> model/")
    prompts = jax.random.randint(jax.random.key(seed + 1), (batch, prompt_len), 0, cfg.vocab_size, jnp.int32)
    lengths = jnp.asarray(np.linspace(prompt_len, max(1, prompt_len // 2), batch).astype(np.int32))
    jax.block_until_ready(forward(params, prompts, cfg))  # compile
    t0 = time.perf_counter()
    logits = jax.block_until_ready(forward(params, prompts, cfg))
    forward_tps = batch * prompt_len / (time.perf_counter() - t0)
    print(f"  forward: {batch}x{prompt_len} tokens -> logits {tuple(logits.shape)}, {forward_tps:,.0f} tokens/s")
    greedy_generate(params, cfg, prompts, lengths, new_tokens).block_until_ready()  # compile
    t0 = time.perf_counter()
    greedy_generate(params, cfg, prompts, lengths, new_tokens).block_until_ready()
    decode_tps = batch * new_tokens / (time.perf_counter() - t0)
    print(f"  greedy decode: batch {batch}, prompt lengths {np.asarray(lengths).tolist()}, {new_tokens} new tokens "
          f"per row, {decode_tps:,.0f} tokens/s (prefill included)")
    stats = {"preset": preset, "params_total": param_count(cfg), "params_active": param_count(cfg, active=True),
             "forward_tokens_per_s": round(forward_tps, 1), "greedy_decode_tokens_per_s": round(decode_tps, 1)}
    return params, stats


def rollout_stage(out: Path, questions: list[dict], params, args: argparse.Namespace) -> tuple[list, dict]:
    import jax
    from tqdm import tqdm

    from searchjax.cli.rollout import check_generated, check_prompt_lengths, summarize, warm_up
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
    compile_s = warm_up(agent, check_prompt_lengths(agent, items, args.max_len)[0], sampling)
    t0 = time.perf_counter()
    # The reference model is the starting policy itself here (RL has not moved it yet).
    with tqdm(total=len(items) * (args.group + 1), desc="  rollouts", unit="rollout", file=sys.stderr,
              disable=not show_progress()) as bar:
        records = run_rollouts(agent, items, args.group, jax.random.key(args.seed), reference_params=params,
                               on_record=lambda record: bar.update())
    wall = time.perf_counter() - t0
    check_generated(records)
    write_jsonl(records, out / "rollouts.jsonl")
    stats = summarize(records, wall, compile_s)
    done(f"{len(records)} rollouts ({len(items)} questions x G={args.group} + 1 reference each), "
         f"{stats['policy_tokens']:,} policy tokens, {stats['tokens_per_s']:,.0f} tokens/s after a "
         f"{compile_s:.0f} s compile, {stats['tool_calls']} search_web calls ({stats['tool_failures']} failed), "
         f"finish reasons {stats['finish_reasons']} -> rollouts.jsonl")
    return records, stats


def reward_stage(questions: list[dict], records: list, seed: int) -> dict:
    """r_base by answer matching and the anchored tool penalty (RECIPE.md §4) over the [N, G] policy rollouts."""
    import jax
    import numpy as np

    from searchjax.rewards import RewardConfig, qa_correct, tool_penalty

    done = _stage("7 rewards")
    by_id = {q["id"]: q for q in questions}
    policy = [r for r in records if r.model == "policy"]
    ids = sorted({r.prompt_id for r in policy})
    g = 1 + max(r.group_index for r in policy)
    correct, calls, failures, mask = (np.zeros((len(ids), g), np.float32) for _ in range(4))
    for r in policy:
        i, j = ids.index(r.prompt_id), r.group_index
        gold = by_id[r.prompt_id]
        correct[i, j] = qa_correct(r.answer, [gold["answer"], *gold["aliases"]])
        calls[i, j], failures[i, j], mask[i, j] = r.tool_calls, r.tool_failures, 1
    cfg = RewardConfig()
    pen = tool_penalty(calls, failures, correct, key=jax.random.key(seed), alpha_win=cfg.alpha_win,
                       alpha_lose=cfg.alpha_lose, beta_lose=cfg.beta_lose, mask=mask > 0)
    pen_mean = float(np.asarray(pen)[mask > 0].mean())
    done(f"r_base (answer matches gold or an alias): {correct.sum():.0f}/{mask.sum():.0f} correct; anchored tool "
         f"penalty pen_tool mean {pen_mean:.3f} (alpha_win={cfg.alpha_win}, "
         f"alpha_lose={cfg.alpha_lose}, beta_lose={cfg.beta_lose})")
    print("  (the preference score s needs the Bradley-Terry reward model, not in the pipeline yet: the gated "
          "reward R = r_base*s - pen_eff and the length penalty are not computed)")
    return {"correct": int(correct.sum()), "rollouts": int(mask.sum()), "pen_tool_mean": round(pen_mean, 4)}


def write_summary(out: Path, summary: dict) -> None:
    """summary.json (the stages' figures) and README.md (what each artefact is) in the demo directory."""
    from searchjax.atomic import atomic_write_text

    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    lines = ["# searchjax demo artefacts", "", "Written by `searchjax demo` "
             f"(preset {summary['args']['preset']!r}, seed {summary['args']['seed']}) in "
             f"{summary['wall_s']:.0f} s; the figures of each stage are in summary.json.", ""]
    lines += [f"- `{name}`: {what}" for name, what in ARTEFACTS.items()]
    atomic_write_text(out / "README.md", "\n".join(lines) + "\n")


@run_command
def run_demo(args: argparse.Namespace) -> int:
    from searchjax.atomic import atomic_path

    out = Path(args.out)
    if args.out == DEFAULT_OUT:
        out.parent.mkdir(parents=True, exist_ok=True)  # runs/ on a fresh checkout
    check_output(out, args.overwrite, kind="dir")
    t0 = time.perf_counter()
    summary: dict = {"args": {k: v for k, v in vars(args).items() if k != "func"}}
    with atomic_path(out) as tmp:  # built aside, moved into place when every stage has passed
        tmp.mkdir()
        summary.update(build_world_and_index(tmp, args.seed, args.docs))
        tok = train_demo_tokenizer(tmp, args.vocab_size)
        summary["tokenizer"] = {"vocab_size": tok.vocab_size, "asked": args.vocab_size}
        questions, summary["data"] = synth_questions(tmp, args.seed, args.questions)
        if not questions:
            raise CLIError("no verified question was generated; try a larger --docs")
        params, summary["model"] = model_stage(tmp, args.preset, args.seed, tok, batch=4, prompt_len=16,
                                               new_tokens=16)
        records, summary["rollouts"] = rollout_stage(tmp, questions, params, args)
        summary["rewards"] = reward_stage(questions, records, args.seed)
        summary["wall_s"] = round(time.perf_counter() - t0, 1)
        write_summary(tmp, summary)
    print(f"demo: done in {summary['wall_s']:.0f} s; artefacts in {out} (README.md describes them)")
    return 0


DEFAULT_OUT = "runs/demo"


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="run the main job on the embedded default (tiny model, offline, CPU)")
    p.add_argument("--out", default=DEFAULT_OUT, help="artefact directory")
    add_overwrite(p)
    p.add_argument("--preset", default="tiny", help="model preset (configs/model/NAME.yaml)")
    p.add_argument("--seed", type=int, default=0, help="PRNG seed of every stage")
    p.add_argument("--docs", type=positive_int, default=3000,
                   help="world size in documents (the real-facts part, ~2,000 documents here, is always whole)")
    p.add_argument("--vocab-size", type=int_at_least(290), default=2048, help="tokenizer vocabulary (= the model's)")
    p.add_argument("--questions", type=positive_int, default=6, help="verified multi-hop questions to generate")
    p.add_argument("--group", type=positive_int, default=4, help="rollouts per question (G)")
    p.add_argument("--budget", type=non_negative_int, default=2, help="search_web calls per rollout")
    p.add_argument("--max-new-tokens", type=positive_int, default=48, help="policy tokens per rollout")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--slots", type=positive_int, default=8, help="concurrent decodes in the engine")
    p.add_argument("--max-len", type=positive_int, default=4096, help="cache positions per slot")
    p.set_defaults(func=run_demo)
