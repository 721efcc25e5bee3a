"""The search environment: the search_web tool contract, index backends, and the offline world to search.

Public API (others code against these names):
- `SearchResult(title, url, snippet)`, `SearchError`, the `SearchBackend` protocol
  (`search(query, k=10) -> list[SearchResult]`, raising only SearchError);
- backends: `TantivyBackend(index_dir)` (BM25 on disk, built by `build_index(corpus_jsonl, out_dir)`),
  `HttpBackend(url, timeout_s, retries)` (client of `serve_search` / `SearchHTTPServer`; helpers
  `serving_in_background`, `wait_until_serving`),
  `MemoryBackend(docs)` (tests);
- the tool: `SEARCH_WEB_TOOL` (OpenAI-style schema), `SearchTool(backend, max_calls=5)` whose
  `call(arguments) -> ToolCallResult` never raises, `budget_instruction(b)`, `render_results`,
  `truncate_query`, and the limits `MAX_QUERY_CHARS`, `MAX_RESULTS`, `TRAIN_MAX_CALLS`;
- the world: `build_world(out_dir, seed, ...)` and `KnowledgeBase` (see searchjax.search.world for the
  corpus and knowledge-base formats).
"""

from searchjax.search.http import (
    HttpBackend,
    SearchHTTPServer,
    serve_search,
    serving_in_background,
    wait_until_serving,
)
from searchjax.search.memory import MemoryBackend
from searchjax.search.tantivy_index import TantivyBackend, build_index
from searchjax.search.tool import (
    MAX_QUERY_CHARS,
    MAX_RESULTS,
    SEARCH_WEB_TOOL,
    TOOL_NAME,
    TRAIN_MAX_CALLS,
    SearchTool,
    ToolCallResult,
    budget_instruction,
    render_results,
    truncate_query,
)
from searchjax.search.types import SearchBackend, SearchError, SearchResult, iter_corpus, tokenize
from searchjax.search.world import Entity, KnowledgeBase, Relation, WorldConfig, build_world

__all__ = [
    "MAX_QUERY_CHARS",
    "MAX_RESULTS",
    "SEARCH_WEB_TOOL",
    "TOOL_NAME",
    "TRAIN_MAX_CALLS",
    "Entity",
    "HttpBackend",
    "KnowledgeBase",
    "MemoryBackend",
    "Relation",
    "SearchBackend",
    "SearchError",
    "SearchHTTPServer",
    "SearchResult",
    "SearchTool",
    "TantivyBackend",
    "ToolCallResult",
    "WorldConfig",
    "budget_instruction",
    "build_index",
    "build_world",
    "iter_corpus",
    "render_results",
    "serve_search",
    "serving_in_background",
    "tokenize",
    "truncate_query",
    "wait_until_serving",
]
