"""CLI for the search environment: `world build`, `index build`, `search`, `serve-search`."""

from __future__ import annotations

import argparse
import json
import sys


def _world_build(args: argparse.Namespace) -> int:
    from searchjax.search.world import build_world

    try:
        manifest = build_world(args.out, seed=args.seed, n_docs=args.docs, include_real=not args.no_real,
                               n_real_cities=args.real_cities, distractor_rate=args.distractor_rate)
    except (OSError, ValueError) as e:  # bad sizes or rates, unwritable --out
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {manifest['num_docs']} documents, {manifest['num_entities']} entities and "
          f"{manifest['num_relations']} relations to {args.out}")
    return 0


def _index_build(args: argparse.Namespace) -> int:
    from searchjax.search import build_index

    try:
        n = build_index(args.corpus, args.out)
    except (OSError, ValueError) as e:  # unreadable corpus, bad line (file:line), occupied output folder
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"indexed {n} documents into {args.out}")
    return 0


def _search(args: argparse.Namespace) -> int:
    from searchjax.search import MAX_RESULTS, SearchError, TantivyBackend, render_results, truncate_query

    query = truncate_query(" ".join(args.query))
    try:
        results = TantivyBackend(args.index).search(query, min(args.k, MAX_RESULTS))
    except SearchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([r.to_dict() for r in results], ensure_ascii=False, indent=1))
    else:
        print(render_results(query, results))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from searchjax.search import SearchError, serve_search

    def ready(url: str) -> None:
        print(f"serving {args.index} on {url} (POST /search, GET /health)", flush=True)

    try:
        serve_search(args.index, host=args.host, port=args.port, on_ready=ready)
    except (SearchError, OSError, ValueError) as e:  # not an index, port taken or out of range
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def register(subparsers) -> None:
    world = subparsers.add_parser("world", help="the offline world to search").add_subparsers(
        dest="world_command", metavar="ACTION", required=True)
    p = world.add_parser("build", help="generate DIR/corpus.jsonl, DIR/kb.jsonl and DIR/world.json")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--docs", type=int, default=20_000, help="about how many documents (default 20000)")
    p.add_argument("--real-cities", type=int, default=500, help="real cities besides capitals (default 500)")
    p.add_argument("--distractor-rate", type=float, default=0.15, help="share of look-alike entities")
    p.add_argument("--no-real", action="store_true", help="leave out the real-facts part")
    p.set_defaults(func=_world_build)

    index = subparsers.add_parser("index", help="the tantivy search index").add_subparsers(
        dest="index_command", metavar="ACTION", required=True)
    p = index.add_parser("build", help="index a JSONL corpus (title, url, text)")
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_index_build)

    p = subparsers.add_parser("search", help="query a tantivy index")
    p.add_argument("--index", required=True)
    p.add_argument("--json", action="store_true", help="print a JSON list of {title, url, snippet}")
    p.add_argument("-k", type=int, default=10, help="results (at most 10)")
    p.add_argument("query", nargs="+")
    p.set_defaults(func=_search)

    p = subparsers.add_parser("serve-search", help="serve a tantivy index over HTTP")
    p.add_argument("--index", required=True)
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--host", default="127.0.0.1")
    p.set_defaults(func=_serve)
