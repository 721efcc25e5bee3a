"""CLI for the search environment: `world build`, `index build`, `search`, `serve-search`."""

from __future__ import annotations

import argparse
import json
import sys

from searchjax.cli.common import (INDEX_HELP, add_overwrite, check_input_dir, check_input_file, check_output,
                                  check_port, float_in, non_negative_int, open_search_backend, positive_int,
                                  run_command, show_progress)


@run_command
def _world_build(args: argparse.Namespace) -> int:
    from searchjax.search.world import build_world

    out = check_output(args.out, args.overwrite, kind="dir")
    manifest = build_world(out, seed=args.seed, n_docs=args.docs, include_real=not args.no_real,
                           n_real_cities=args.real_cities, distractor_rate=args.distractor_rate,
                           progress=show_progress())
    real, fictional = manifest["num_docs_real"], manifest["num_docs_fictional"]
    print(f"wrote {manifest['num_docs']:,} documents ({fictional:,} fictional + {real:,} real-facts), "
          f"{manifest['num_entities']:,} entities and {manifest['num_relations']:,} relations to {out}")
    if manifest["num_docs"] > 1.2 * args.docs:
        print(f"note: {manifest['num_docs']:,} documents for --docs {args.docs}: the real-facts part alone has "
              f"{real:,} (--no-real leaves it out, --real-cities shrinks it)", file=sys.stderr)
    return 0


@run_command
def _index_build(args: argparse.Namespace) -> int:
    from searchjax.search import build_index

    corpus = check_input_file(args.corpus, "--corpus")
    out = check_output(args.out, args.overwrite, kind="dir")
    n = build_index(corpus, out, progress=show_progress())
    print(f"indexed {n:,} documents into {out}")
    return 0


@run_command
def _search(args: argparse.Namespace) -> int:
    from searchjax.search import MAX_QUERY_CHARS, MAX_RESULTS, render_results, truncate_query

    backend = open_search_backend(args.index)
    text = " ".join(args.query)
    query = truncate_query(text)
    if query != text:
        print(f"note: the query has {len(text)} characters, more than {MAX_QUERY_CHARS}; searched the first "
              f"{len(query)}: {query!r}", file=sys.stderr)
    results = backend.search(query, min(args.k, MAX_RESULTS))
    if args.json:
        print(json.dumps([r.to_dict() for r in results], ensure_ascii=False, indent=1))
    else:
        print(render_results(query, results))
    return 0


@run_command
def _serve(args: argparse.Namespace) -> int:
    from searchjax.search import serve_search

    check_input_dir(args.index, "--index")

    def ready(url: str) -> None:
        print(f"serving {args.index} on {url} (POST /search, GET /health)", flush=True)

    serve_search(args.index, host=args.host, port=args.port, on_ready=ready)
    return 0


def register(subparsers) -> None:
    world = subparsers.add_parser("world", help="the offline world to search").add_subparsers(
        dest="world_command", metavar="ACTION", required=True)
    p = world.add_parser("build", help="generate DIR/corpus.jsonl, DIR/kb.jsonl and DIR/world.json")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0, help="PRNG seed: the same seed gives the same world")
    p.add_argument("--docs", type=positive_int, default=20_000,
                   help="about how many documents in all; the real-facts part (~3,000 documents with the default "
                        "--real-cities) is always whole, so a smaller value still gets it")
    p.add_argument("--real-cities", type=non_negative_int, default=500, help="real cities besides capitals")
    p.add_argument("--distractor-rate", type=float_in(0.0, 1.0), default=0.15,
                   help="share of look-alike entities, in [0, 1]")
    p.add_argument("--no-real", action="store_true", help="leave out the real-facts part")
    add_overwrite(p)
    p.set_defaults(func=_world_build)

    index = subparsers.add_parser("index", help="the tantivy search index").add_subparsers(
        dest="index_command", metavar="ACTION", required=True)
    p = index.add_parser("build", help="index a JSONL corpus (title, url, text)")
    p.add_argument("--corpus", required=True, help="JSONL corpus, one {title, url, text} object a line")
    p.add_argument("--out", required=True, help="output index directory")
    add_overwrite(p)
    p.set_defaults(func=_index_build)

    p = subparsers.add_parser("search", help="query a tantivy index or a search service")
    p.add_argument("--index", required=True, help=INDEX_HELP)
    p.add_argument("--json", action="store_true", help="print a JSON list of {title, url, snippet}")
    p.add_argument("-k", type=positive_int, default=10, help="results (at most 10)")
    p.add_argument("query", nargs="+", help="query words (at most 250 characters are searched)")
    p.set_defaults(func=_search)

    p = subparsers.add_parser("serve-search", help="serve a tantivy index over HTTP (README: HTTP search service)")
    p.add_argument("--index", required=True, help="tantivy index directory")
    p.add_argument("--port", type=check_port, default=8765, help="TCP port (0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1: loopback only)")
    p.set_defaults(func=_serve)
