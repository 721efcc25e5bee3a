"""The budget-forced sweep (RECIPE.md §5): every model × question × budget b × sample through the rollout driver.

Protocol. The system prompt states the hard cap b (searchjax.search.budget_instruction) and the harness
enforces it: the search tool refuses a call past b (it fails and counts), and a second call past the budget ends
the rollout. b = 0 is parametric only, `tool_choice=none` semantics: the tool is still offered in the system turn,
and any call is a broken call that executes nothing.

Batching. One `RolloutDriver` per model runs all of its budgets, questions and samples together over the
engine's slots (continuous batching): every trajectory is a `PromptItem` carrying its own budget b, and the
agent's `rollouts` call for it (one call per trajectory, so that its key is its own) only queues its first-turn
request on `_SharedRun`, which then runs every queued request, and every follow-up turn, in one
`RolloutDriver.run`. Models with the same architecture and tokenizer
share one engine (each gets its own driver over it; weights are an argument of the jitted kernels, so nothing
recompiles), so a post-trained policy and its starting checkpoint compile once.

Randomness. Trajectory (question q, budget b, sample s) draws from the key
fold_in(fold_in(fold_in(key(seed), crc32(q)), b), s), the same for every model (common random numbers for
side-by-side comparisons) and independent of which other trajectories share the batch (the engine's sampling
depends on a request's key and tokens only), so a resumed run reproduces an uninterrupted one.

Resume. results.jsonl holds one line per finished trajectory (searchjax.eval.results); a rerun with the same
--out skips the (model, question, budget, sample) keys already there, after checking that the settings that
change results (run.json) are the same.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import jax
from tqdm import tqdm

from searchjax.atomic import atomic_write_text
from searchjax.chat import Tokenizer, load_tokenizer
from searchjax.config import ConfigError, to_dict
from searchjax.eval.cost import ModelPrice, PriceTable
from searchjax.eval.dataset import EvalQuestion
from searchjax.eval.graders import Grader
from searchjax.eval.plots import write_figures
from searchjax.eval.preference import PairScorer, preference_vs_baseline
from searchjax.eval.results import Key, ResultsFile, result_row, row_key
from searchjax.eval.summary import internal_metrics, summary_csv, summary_markdown, summary_rows
from searchjax.model import ModelConfig, load_hf
from searchjax.rollout import AgentConfig, PromptItem, Request, RolloutDriver, Sampling, SearchAgent, SearchJaxEngine
from searchjax.search import SearchBackend


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Sweep settings (configs/eval/default.yaml holds the write-up's: b = 0..10, T = 0.6, 8192 tokens).

    max_results: search results a call shows (the write-up's 10; a policy trained with fewer, as the CPU science
    runs are, is evaluated with as many). max_len: cache positions per slot, capped at the model's max_position_embeddings. trajectories_per_run:
    trajectories per driver run (bounds the host memory the driver holds; runs are back to back).
    prices: a price-table YAML ("" = configs/eval/prices.yaml); price_model: its entry that prices every model.
    grader_workers: threads for an LLM grader's requests (the rule grader runs inline).
    language_min_confidence: the probability an answer's identified language needs to count in the
    language-mismatch metric.
    """

    budgets: tuple[int, ...] = tuple(range(11))
    samples: int = 1
    temperature: float = 0.6
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 8192
    max_results: int = 10
    seed: int = 0
    enable_thinking: bool = True
    slots: int = 32
    max_len: int = 32768
    max_prefill_length: int = 512
    trajectories_per_run: int = 1024
    grader: Literal["rule", "llm"] = "rule"
    judge_url: str = ""
    judge_model: str = "default"
    grader_workers: int = 8
    prices: str = ""
    price_model: str = "qwen3.5-plus"
    language_min_confidence: float = 0.5

    def __post_init__(self):
        if not self.budgets or any(b < 0 for b in self.budgets) or len(set(self.budgets)) != len(self.budgets):
            raise TypeError(f"EvalConfig.budgets: distinct non-negative budgets required, got {self.budgets}")
        for name in ("samples", "max_new_tokens", "slots", "max_len", "trajectories_per_run", "grader_workers"):
            if getattr(self, name) < 1:
                raise TypeError(f"EvalConfig.{name}: expected >= 1, got {getattr(self, name)}")
        if not 1 <= self.max_results <= 10:
            raise TypeError(f"EvalConfig.max_results: expected 1..10 (the search_web contract), got {self.max_results}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise TypeError(f"EvalConfig: need temperature >= 0, 0 < top_p <= 1, top_k >= 0, got "
                            f"{self.temperature}, {self.top_p}, {self.top_k}")
        if self.grader == "llm" and not self.judge_url:
            raise TypeError("EvalConfig: grader 'llm' needs judge_url (an OpenAI-compatible endpoint)")
        if not 0 <= self.language_min_confidence <= 1:
            raise TypeError(f"EvalConfig.language_min_confidence: expected [0, 1], got {self.language_min_confidence}")

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.top_k)


@dataclasses.dataclass(frozen=True)
class PolicyModel:
    """A model to evaluate: its label (the name in every output), where it came from, and its pieces."""

    label: str
    path: str
    cfg: ModelConfig
    params: Any
    tokenizer: Tokenizer


def parse_model_spec(spec: str) -> tuple[str, str]:
    """[LABEL=]DIR -> (label, dir); the label defaults to the path as given."""
    label, sep, path = spec.partition("=")
    if not sep:
        return spec, spec
    if not label or not path:
        raise ValueError(f"--model expects [LABEL=]DIR, got {spec!r}")
    return label, path


def load_policy(label: str, path: str | Path) -> PolicyModel:
    """An HF checkpoint directory (config.json, safetensors, tokenizer.json) as a PolicyModel."""
    cfg, params = load_hf(path)
    tokenizer = load_tokenizer(path)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(f"{path}: the tokenizer has {tokenizer.vocab_size} ids, the model {cfg.vocab_size} rows")
    return PolicyModel(label, str(path), cfg, params, tokenizer)


def trajectory_key(seed: int, question_id: str, budget: int, sample: int) -> jax.Array:
    """The PRNG key of one trajectory (module docstring)."""
    key = jax.random.fold_in(jax.random.key(seed), zlib.crc32(question_id.encode()))
    return jax.random.fold_in(jax.random.fold_in(key, budget), sample)


class _SharedRun:
    """Stands in for a SearchAgent's driver: each `rollouts` call queues its first-turn requests here, and
    `run_all` runs them all, with every follow-up turn, in one run of the real driver. Everything else the
    agent reads (engine, tokenizer, params, ...) is the real driver's."""

    def __init__(self, driver: RolloutDriver):
        self.driver = driver
        self._queued: list[Request] = []
        self._on_finish: dict[int, Callable] = {}

    def __getattr__(self, name: str):
        return getattr(self.driver, name)

    def run(self, requests, on_finish=None):
        for r in requests:
            self._queued.append(r)
            self._on_finish[id(r.tag)] = on_finish
        return []

    def run_all(self) -> None:
        def dispatch(c):
            follow = self._on_finish[id(c.request.tag)](c)
            if not follow:
                del self._on_finish[id(c.request.tag)]
            return follow

        queued, self._queued = self._queued, []
        self.driver.run(queued, on_finish=dispatch)


@dataclasses.dataclass
class ModelStats:
    """What one model's sweep did in this invocation (resumed trajectories are not counted)."""

    trajectories: int = 0
    tokens: int = 0
    wall_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0


def _engine_for(model: PolicyModel, cfg: EvalConfig, engine: SearchJaxEngine | None) -> SearchJaxEngine:
    """`engine` when it serves the same architecture and tokenizer (its weights are swapped), else a new one."""
    if engine is not None and engine.cfg == model.cfg and engine.tokenizer.hf.to_str() == model.tokenizer.hf.to_str():
        return engine
    return SearchJaxEngine(
        model.cfg, model.params, model.tokenizer, max_concurrent_decodes=cfg.slots,
        max_prefill_length=cfg.max_prefill_length, max_len=min(cfg.max_len, model.cfg.max_position_embeddings),
        sampling=cfg.sampling,
    )


def _work(questions: Sequence[EvalQuestion], cfg: EvalConfig, label: str, done: Mapping[Key, Any]):
    return [(q, b, s) for q in questions for b in cfg.budgets for s in range(cfg.samples)
            if (label, q.id, b, s) not in done]


def sweep_model(model: PolicyModel, driver: RolloutDriver, questions: Sequence[EvalQuestion],
                backend: SearchBackend, cfg: EvalConfig, grader: Grader, results: ResultsFile,
                rows: dict[Key, dict[str, Any]], progress: bool = True) -> ModelStats:
    """Run every unfinished trajectory of `model` through `driver` (holding the model's weights); each graded
    line is appended to `results` as it finishes.

    The rule grader grades in the driver's loop (microseconds). An LLM grader's requests would stall the loop for
    their round trips, so they run on `cfg.grader_workers` threads and each line is written when its grade
    arrives (a kill then loses at most the lines whose grades are in flight).
    """
    todo = _work(questions, cfg, model.label, rows)
    stats = ModelStats()
    if not todo:
        return stats
    pool = ThreadPoolExecutor(cfg.grader_workers) if cfg.grader == "llm" else None
    grading: list[tuple[Future, int]] = []

    def write(row: dict[str, Any], tokens: int) -> None:
        results.append(row)
        rows[row_key(row)] = row
        stats.trajectories += 1
        stats.tokens += tokens
        bar.update()

    def drain(wait: bool) -> None:
        while grading and (wait or grading[0][0].done()):
            future, tokens = grading.pop(0)
            write(future.result(), tokens)

    shared = _SharedRun(driver)
    # Every item carries its own budget b; AgentConfig.budget (for items without one) is never used here.
    agent = SearchAgent(shared, backend, AgentConfig(max_new_tokens=cfg.max_new_tokens, sampling=cfg.sampling,
                                                     enable_thinking=cfg.enable_thinking,
                                                     max_results=cfg.max_results))
    total = len(questions) * len(cfg.budgets) * cfg.samples
    bar = tqdm(total=total, initial=total - len(todo), desc=f"eval {model.label}", unit="traj", file=sys.stderr,
               disable=not progress)
    t0 = time.perf_counter()
    try:
        with bar:
            for start in range(0, len(todo), cfg.trajectories_per_run):
                for q, b, s in todo[start : start + cfg.trajectories_per_run]:

                    def on_record(record, q=q, b=b, s=s):
                        if pool is None:
                            write(result_row(model.label, q, b, s, record, grader), record.response_length)
                        else:
                            grading.append((pool.submit(result_row, model.label, q, b, s, record, grader),
                                            record.response_length))
                            drain(wait=False)

                    item = PromptItem.from_record({"id": q.id, "question": q.question}, b)
                    agent.rollouts([item], 1, trajectory_key(cfg.seed, q.id, b, s), on_record=on_record)
                shared.run_all()
            drain(wait=True)
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    stats.wall_s = time.perf_counter() - t0
    return stats


def fingerprint(cfg: EvalConfig, models: Sequence[PolicyModel], questions_source: str,
                questions: Sequence[EvalQuestion]) -> dict[str, Any]:
    """The settings that change results: a resumed run must match them (budgets, samples and models may grow)."""
    keep = ("temperature", "top_p", "top_k", "max_new_tokens", "max_results", "seed", "enable_thinking", "max_len",
            "grader", "judge_model")
    digest = hashlib.sha256(json.dumps([dataclasses.asdict(q) for q in questions], sort_keys=True).encode())
    return {"settings": {k: v for k, v in to_dict(cfg).items() if k in keep},
            "questions": {"source": questions_source, "sha256": digest.hexdigest()},
            "models": {m.label: m.path for m in models}}


def _check_resume(out_dir: Path, current: dict[str, Any]) -> None:
    path = out_dir / "run.json"
    if not path.exists():
        return
    try:
        old = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e.msg})") from None
    diff = [f"{k}: {old.get(k)!r} -> {current[k]!r}" for k in ("settings", "questions") if old.get(k) != current[k]]
    diff += [f"model {label!r}: {old['models'][label]!r} -> {p!r}" for label, p in current["models"].items()
             if label in old.get("models", {}) and old["models"][label] != p]
    if diff:
        raise ConfigError(f"{out_dir} holds a run with other settings ({'; '.join(diff)}); use a new --out")
    current["models"] = {**old.get("models", {}), **current["models"]}


@dataclasses.dataclass
class SweepReport:
    summary: list[dict[str, Any]]
    metrics: list[dict[str, Any]]
    preference: list[dict[str, Any]]
    stats: dict[str, ModelStats]
    resumed: int


def run_sweep(models: Sequence[PolicyModel], questions: Sequence[EvalQuestion], backend: SearchBackend,
              cfg: EvalConfig, out_dir: str | Path, *, grader: Grader, prices: PriceTable,
              questions_source: str, price_models: Mapping[str, str] | None = None,
              engine: SearchJaxEngine | None = None, scorer: PairScorer | None = None, baseline: str | None = None,
              progress: bool = True) -> SweepReport:
    """Sweep every model, then write summary.csv, summary.md, metrics.json and the two PNGs into `out_dir`."""
    labels = [m.label for m in models]
    if len(set(labels)) != len(labels):
        raise ValueError(f"model labels must be unique, got {labels}")
    if (scorer is None) != (baseline is None):
        raise ValueError("the preference metric needs both a scorer and a baseline label")
    price_of = {m.label: prices.price((price_models or {}).get(m.label, cfg.price_model)) for m in models}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    current = fingerprint(cfg, models, questions_source, questions)
    _check_resume(out_dir, current)
    atomic_write_text(out_dir / "run.json", json.dumps(current, indent=1) + "\n")
    results = ResultsFile(out_dir / "results.jsonl")
    rows = results.load()
    resumed = sum(1 for key in rows if key[0] in labels)
    stats = {}
    for model in models:
        engine = _engine_for(model, cfg, engine)
        driver = RolloutDriver(engine, model.params)
        stats[model.label] = sweep_model(model, driver, questions, backend, cfg, grader, results, rows, progress)
    order = {q.id: i for i, q in enumerate(questions)}
    results.finalize(sorted(rows.values(), key=lambda r: (r["model"], order.get(r["question_id"], len(order)),
                                                          r["question_id"], r["budget"], r["sample"])))
    return write_reports(rows, models, questions, cfg, out_dir, price_of, prices, stats, resumed, scorer, baseline)


def write_reports(rows: Mapping[Key, dict[str, Any]], models: Sequence[PolicyModel],
                  questions: Sequence[EvalQuestion], cfg: EvalConfig, out_dir: Path,
                  price_of: Mapping[str, ModelPrice], prices: PriceTable, stats: dict[str, ModelStats],
                  resumed: int, scorer: PairScorer | None, baseline: str | None) -> SweepReport:
    """summary.csv, metrics.json, summary.md and the figures over this run's trajectories."""
    labels = [m.label for m in models]
    ids = {q.id for q in questions}
    mine = [r for r in rows.values() if r["model"] in labels and r["question_id"] in ids
            and r["budget"] in cfg.budgets and r["sample"] < cfg.samples]
    summary = summary_rows(mine, price_of, labels, cfg.budgets)
    metrics = internal_metrics(mine, labels, cfg.budgets, cfg.language_min_confidence)
    preference = (preference_vs_baseline(mine, {q.id: q for q in questions}, baseline, scorer, labels, cfg.budgets)
                  if scorer is not None else [])
    atomic_write_text(out_dir / "summary.csv", summary_csv(summary))
    atomic_write_text(out_dir / "metrics.json",
                      json.dumps(_nan_to_none({"internal": metrics, "preference": preference}), indent=1) + "\n")
    priced = ", ".join(f"{label}: {price.source or 'table entry'}" for label, price in price_of.items())
    header = (f"# Budget-forced evaluation\n\nModels: {', '.join(f'{m.label} ({m.path})' for m in models)}. "
              f"{len(questions)} questions × budgets {list(cfg.budgets)} × {cfg.samples} sample(s); temperature "
              f"{cfg.temperature}, at most {cfg.max_new_tokens} new tokens, seed {cfg.seed}, grader {cfg.grader}. "
              f"Prices: table of {prices.date} ({priced}).")
    atomic_write_text(out_dir / "summary.md", summary_markdown(summary, metrics, preference, header))
    write_figures(summary, labels, out_dir)
    return SweepReport(summary, metrics, preference, stats, resumed)


def _nan_to_none(value: Any) -> Any:
    """NaN (an undefined metric) as JSON null: json.dumps would write the non-standard NaN."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return value
