"""Benchmark the search backends on a generated world: queries/s and first-hop recall@10.

Side by side in one run:
- embedded TantivyBackend (BM25 + snippets + stored fields) vs the bare tantivy top-10 search on the same
  index and queries (the machine's own ceiling for this index): queries/s and their ratio, medians of
  --rounds alternating passes;
- whether TantivyBackend's results equal reference_search's (the same hits with snippets from the definition,
  snippets.query_snippet) on every query: the run exits 1 if not;
- the HTTP service (a separate process on loopback) vs the embedded backend: queries/s and their ratio;
- recall@10 of the first-hop document: for a relation r sampled from the KB, the query is the phrase that
  names r's far side through its subject (KnowledgeBase.describe_object, e.g. "the birthplace of Ludev
  Zaereitan"), and a hit is any of the top 10 urls among the documents that state r. The in-memory
  backend's recall on the same queries is the reference. Two more figures: queries naming the object
  entity ("the author of The Glass Orchard") and queries naming only a literal value.

    python tools/bench_search.py --docs 100000 --queries 2000 --work /tmp/searchjax_bench
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import portpicker
import tantivy

from searchjax.search import (
    HttpBackend,
    KnowledgeBase,
    MemoryBackend,
    SearchError,
    TantivyBackend,
    build_index,
    build_world,
)
from searchjax.search.http import wait_until_serving
from searchjax.search.tantivy_index import bm25_query
from searchjax.search.types import iter_corpus, query_terms

TARGETS = {"tantivy_qps": 2000.0, "http_qps": 500.0, "recall_at_10": 0.9}


def first_hop_queries(kb: KnowledgeBase, n: int, seed: int, side: str = "object") -> list[tuple[str, set[str]]]:
    """(query, urls of the documents stating the relation) for n relations sampled from the KB.

    side="object": the query names the subject ("the birthplace of Ludev Zaereitan");
    side="subject": it names the object entity ("the author of The Glass Orchard");
    side="literal": it names only a literal value ("the accelerator launched in March 2005"), which many
    entities may share: a figure of how much a value-only hop leaves to later hops, not a target.
    """
    rng = random.Random(seed)
    if side == "object":
        pool, describe = kb.relations, kb.describe_object
    else:
        pool = [r for r in kb.relations if r.literal == (side == "literal")]
        describe = kb.describe_subject
    rels = rng.sample(pool, min(n, len(pool)))
    return [(describe(r), {kb.document(d)["url"] for d in r.doc_ids}) for r in rels]


def qps(search, queries: list[str]) -> float:
    start = time.perf_counter()
    for q in queries:
        search(q)
    return len(queries) / (time.perf_counter() - start)


def paired_qps(ours, reference, queries: list[str], rounds: int) -> tuple[float, float]:
    """Median queries/s of `ours` and `reference` over `rounds` alternating passes: on a shared machine a
    load spike then hits both sides alike instead of skewing their ratio."""
    pairs = [(qps(ours, queries), qps(reference, queries)) for _ in range(rounds)]
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def bare_tantivy(index_dir: Path):
    """Top-10 BM25 hits only: no document rows, no snippets (the same term-disjunction query)."""
    index = tantivy.Index.open(str(index_dir))
    searcher, schema = index.searcher(), index.schema

    def search(query: str):
        return searcher.search(bm25_query(schema, query_terms(query)), limit=10, count=False).hits

    return search


def recall(search, labelled: list[tuple[str, set[str]]]) -> float:
    return sum(bool({r.url for r in search(q, 10)} & urls) for q, urls in labelled) / len(labelled)


def http_service(index_dir: Path):
    """Start `serve_search` in a child process; returns (process, url) once /health answers."""
    port = portpicker.pick_unused_port()
    code = f"from searchjax.search import serve_search; serve_search({str(index_dir)!r}, port={port})"
    proc = subprocess.Popen([sys.executable, "-c", code])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url)
    except SearchError:
        proc.kill()
        raise
    return proc, url


def prepare(work: Path, n_docs: int, seed: int) -> tuple[Path, Path]:
    world, index = work / f"world_{n_docs}_{seed}", work / f"index_{n_docs}_{seed}"
    if not (world / "kb.jsonl").exists():
        t = time.perf_counter()
        m = build_world(world, seed=seed, n_docs=n_docs)
        print(f"world: {m['num_docs']} docs, {m['num_entities']} entities in {time.perf_counter() - t:.1f} s")
    if not index.exists():
        t = time.perf_counter()
        build_index(world / "corpus.jsonl", index)
        print(f"index built in {time.perf_counter() - t:.1f} s")
    return world, index


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--memory-queries", type=int, default=100, help="queries for the slow in-memory reference")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3, help="alternating ours/bare passes (medians reported)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/searchjax_bench"))
    args = ap.parse_args(argv)
    world, index = prepare(args.work, args.docs, args.seed)
    kb = KnowledgeBase.load(world)
    labelled = first_hop_queries(kb, args.queries, args.seed)
    queries = [q for q, _ in labelled]
    backend = TantivyBackend(index)
    out = {"num_docs": backend.num_docs, "queries": len(queries)}
    backend.search(queries[0])  # warm the page cache
    out["tantivy_qps"], out["bare_tantivy_qps"] = paired_qps(backend.search, bare_tantivy(index), queries,
                                                             args.rounds)
    out["tantivy_vs_bare"] = out["tantivy_qps"] / out["bare_tantivy_qps"]
    same = sum(backend.search(q) == backend.reference_search(q) for q in queries)
    out["same_results_as_reference"] = same / len(queries)
    proc, url = http_service(index)
    try:
        out["http_qps"] = qps(HttpBackend(url, timeout_s=5.0).search, queries)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    out["http_vs_tantivy"] = out["http_qps"] / out["tantivy_qps"]
    out["recall_at_10"] = recall(backend.search, labelled)
    for side in ("subject", "literal"):
        side_queries = first_hop_queries(kb, args.queries, args.seed, side)
        out[f"recall_at_10_{side}_named"] = recall(backend.search, side_queries)
    sub = labelled[: args.memory_queries]
    memory = MemoryBackend(iter_corpus(world / "corpus.jsonl"))
    out["recall_at_10_memory_ref"] = recall(memory.search, sub)
    out["recall_at_10_same_subset"] = recall(backend.search, sub)
    for key, target in TARGETS.items():
        out[f"{key}_vs_target"] = out[key] / target
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}, indent=1))
    return 0 if out["same_results_as_reference"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
