"""Stage 2 of the recipe, on-policy GRPO with token-level importance sampling (RECIPE.md §2–§4).

Per step t (one rollout batch; `minibatches` optimizer steps on it, 1 = strictly on-policy):

    prompts   = next(iterator)                          N prompts of the RL Grain mix (90% QA, 10% rubric chat)
    policy    = G rollouts per prompt                   the engine holds the current weights (version t)
    reference = G rollouts per new prompt               the frozen reference policy, cached per prompt id
    r_base    = answer matching (qa) | all rubrics (rubric)
    s         = P̄(x, y_i, y_ref,i)                     the reward model, both orders in one batched call
    R, Â      = compute_rewards(r_base, s, calls, failures, L, L^ref)   gated R = r_base·s − pen_eff
    Â         = balance_advantages(Â)                  advantage_balance "hops": equal mass per hop count (ablation)
    state     = train_step(state, batch)                grpo_loss: log π_T (training forward) against log μ
    sync      = engine ← state.params                   cast to the engine's dtype; no recompile, no rebuild

With filter_groups (dynamic sampling, an ablation) the policy rollouts come first, batch after batch until N groups
with mixed r_base are found, and the reference, the reward model and the update see those N groups. Under the
linear ablation with weight 0 (R = r_base − pen_eff) the reward model is not run.

One engine serves both models: the policy and the reference are two `RolloutDriver`s over it (the params are an
argument of every compiled function). The loop runs the same rollouts on every process (same prompts, keys and
weights give the same tokens) and each process trains on its share of the rows. A checkpoint holds the train
state, the Grain iterator and, in its metadata, the reference cache; a resumed run repeats the uninterrupted
run's rollouts and metrics (the rollout keys are fold_in(key(seed), t)).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Any, Literal

import grain
import jax
import jax.numpy as jnp
import numpy as np

from searchjax.atomic import atomic_write_text
from searchjax.config import ConfigError, to_dict
from searchjax.data.jsonl import DataError
from searchjax.data.pipeline import PipelineConfig, SourceConfig, load_source, mixed_records
from searchjax.losses.advantages import stratum_balanced_advantages
from searchjax.rewards.aggregate import RolloutRecords, calls_covariance, compute_rewards
from searchjax.rewards.config import RewardConfig
from searchjax.rollout.agent import AgentConfig, SearchAgent
from searchjax.rollout.records import REFERENCE, group_records
from searchjax.rollout.sampling import Sampling
from searchjax.train.checkpoint import Checkpointer
from searchjax.train.config import TrainConfig
from searchjax.train.metrics import MetricsLogger
from searchjax.train.optim import lr_schedule, make_optimizer
from searchjax.train.rl import (PreferenceInputs, ReferenceCache, RLPrompt, base_reward, grpo_loss_fn,
                                old_logprobs_fn, prompt_key, train_arrays)
from searchjax.train.rundir import prepare_run_dir
from searchjax.train.runner import host_params, run_mesh
from searchjax.train.state import abstract_state, create_state
from searchjax.train.step import device_batch, make_train_step

QA_SHARE = 0.9  # RECIPE.md §3.3: 90% verifiable QA, 10% rubric chat


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """How rollouts are sampled and served.

    group_size: G rollouts per prompt. reference: "paired" (the write-up: G reference rollouts per prompt, rollout
    i compared with reference rollout i) or "shared" (RECIPE.md §4's cheaper switch: one reference rollout per
    prompt that the whole group is compared with; b_win = b_lose = L_ref). budget: search_web calls per rollout;
    max_new_tokens: policy tokens per rollout over all turns; max_results: results a search shows (as the SFT
    data showed). temperature: the sampler's T, also applied in the trainer's log π. top_p / top_k must stay
    off (1.0 / 0): the trainer would have to apply the same truncation to its log π, and a truncated
    distribution gives the tokens outside it log π = −inf, so RL configs refuse them. slots, max_len,
    max_prefill_length: the engine; dtype: the engine's weights (the trainer's float32 weights are cast at every
    sync); extend_cache: continue a slot's cache across turns instead of re-prefilling the history.
    routing_replay: the trainer's forward sends every token to the experts the engine sent it to (the engine
    always records them, for rollout_corr/route_mismatch); off by default, as in the write-up, which rejected it
    for token-level IS (RECIPE.md §2). Without it a router near-tie broken differently by the two numerically
    different paths moves the canary past 1e-4 (searchjax.train.rl, RESULTS.md).
    """

    group_size: int = 4
    reference: Literal["paired", "shared"] = "paired"
    budget: int = 5
    max_new_tokens: int = 512
    max_results: int = 3
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    enable_thinking: bool = True
    slots: int = 16
    max_len: int = 2048
    max_prefill_length: int = 512
    dtype: Literal["float32", "bfloat16"] = "float32"
    extend_cache: bool = True
    routing_replay: bool = False

    def __post_init__(self):
        if self.group_size < 2:
            raise TypeError(f"rollout.group_size must be >= 2 (GRPO's advantages compare rollouts of a group), "
                            f"got {self.group_size}")
        if not self.temperature > 0:
            raise TypeError(f"rollout.temperature must be > 0 (greedy decoding has no log-probability to learn "
                            f"from), got {self.temperature}")
        if self.top_p != 1.0 or self.top_k != 0:
            raise TypeError(f"rollout.top_p / top_k must be 1.0 / 0 in GRPO (got {self.top_p} / {self.top_k}): the "
                            "trainer's log π would have to apply the same truncation, under which the sampled "
                            "distribution gives log π = −inf outside the kept set; use temperature instead")
        if self.budget < 0 or self.max_new_tokens < 1 or not 1 <= self.max_results <= 10:
            raise TypeError(f"rollout: budget >= 0, max_new_tokens >= 1, 1 <= max_results <= 10 required, got "
                            f"{self.budget}, {self.max_new_tokens}, {self.max_results}")

    def agent(self) -> AgentConfig:
        return AgentConfig(budget=self.budget, max_new_tokens=self.max_new_tokens,
                           sampling=Sampling(self.temperature, self.top_p, self.top_k),
                           enable_thinking=self.enable_thinking, max_results=self.max_results)


@dataclasses.dataclass(frozen=True)
class RLData:
    """Prompts (`--prompts` replaces them) and how rollouts are judged and batched.

    sources: QA (`data synth-qa`) and rubric (`data rubric`) JSONL files with their weights (the recipe's mix
    is 0.9 / 0.1). train_split: only rows whose `split` is this (rows without one are kept), so held-out
    questions never reach training. qa_hops: only QA rows whose `hops` is one of these (a curriculum: questions
    the policy never solves give all-wrong groups, whose r_base advantage is 0; RESULTS.md, session 21); None keeps
    every row. stratify: "hops" splits each QA source by hop count into parts of equal weight, so every hop count
    gets the same share of the prompts and the batches take them in turn (`mix_sources`); "none" draws the QA rows
    as one pool, each batch's hop counts by chance. judge: "rule" (offline) or "llm" (judge_url, judge_model: an
    OpenAI-compatible endpoint) for rubric prompts. buckets: padded widths of the training batch.
    """

    sources: tuple[SourceConfig, ...] = ()
    train_split: str | None = "train"
    qa_hops: tuple[int, ...] | None = None
    stratify: Literal["none", "hops"] = "none"
    judge: Literal["rule", "llm"] = "rule"
    judge_url: str | None = None
    judge_model: str | None = None
    buckets: tuple[int, ...] = (256, 512, 1024, 2048)

    def __post_init__(self):
        bad = [s.kind for s in self.sources if s.kind not in ("qa", "rubric")]
        if bad:
            raise TypeError(f"data.sources: GRPO prompts are kind 'qa' or 'rubric', got {bad}")
        if self.judge == "llm" and not (self.judge_url and self.judge_model):
            raise TypeError("data.judge 'llm' needs data.judge_url and data.judge_model")
        if self.qa_hops is not None and (not self.qa_hops or min(self.qa_hops) < 1):
            raise TypeError(f"data.qa_hops must be hop counts >= 1 (or null for all), got {list(self.qa_hops)}")
        if not self.buckets or min(self.buckets) < 2:
            raise TypeError(f"data.buckets must be widths >= 2, got {list(self.buckets)}")


@dataclasses.dataclass(frozen=True)
class GRPOConfig(TrainConfig):
    """GRPO stage config (configs/train/grpo_*.yaml). `steps` counts rollout batches, `batch_size` prompts per
    batch (N; the batch has N·G rollouts); `minibatches` optimizer steps per rollout batch (1 = on-policy; more
    is the PPO-style ablation, with rewards.clip_eps for the clip). rewards: every coefficient and ablation
    switch of RECIPE.md §2/§4. scorer_batch_pairs, scorer_buckets: the reward model's batching;
    scorer_likelihood_turns: which assistant turns a reward model's likelihood term sums over ("last", the
    default: the final turn, as the preference pairs were written; "all": every turn, searches included;
    `PreferenceInputs`). advantage_balance: "hops" rescales each group's advantages so that every stratum of the
    batch's prompts (QA prompts by hop count, rubric prompts apart: `prompt_strata`) carries the same advantage
    mass, each stratum's scale capped at balance_max_scale (`stratum_balanced_advantages`; an ablation, not in the
    write-up); "none" (the default) trains on Â as computed. filter_groups: dynamic sampling (DAPO, an ablation):
    each step keeps drawing batches of N prompts and rolling out G each until N groups with mixed r_base
    (`mixed_groups`: the only groups whose correctness advantage is not 0) are found, at most filter_max_draws
    batches, and trains on those (`select_groups`); the reference rollouts and the reward model run on the kept
    groups only."""

    rollout: RolloutSettings = RolloutSettings()
    data: RLData = RLData()
    rewards: RewardConfig = RewardConfig()
    minibatches: int = 1
    loss_chunk: int = 4096
    router_aux_loss_coef: float | None = None
    scorer_batch_pairs: int = 8
    scorer_buckets: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
    scorer_likelihood_turns: Literal["last", "all"] = "last"
    advantage_balance: Literal["none", "hops"] = "none"
    balance_max_scale: float = 4.0
    filter_groups: bool = False
    filter_max_draws: int = 4

    def __post_init__(self):
        super().__post_init__()
        if not self.balance_max_scale > 0:
            raise TypeError(f"balance_max_scale: expected > 0, got {self.balance_max_scale}")
        if self.filter_max_draws < 1:
            raise TypeError(f"filter_max_draws: expected >= 1 rollout batches per step, got {self.filter_max_draws}")
        rows = self.batch_size * self.rollout.group_size
        if self.minibatches < 1 or rows % self.minibatches or (rows // self.minibatches) % self.optim.micro_batches:
            raise TypeError(f"minibatches ({self.minibatches}) must divide the N·G = {rows} rollouts of a batch, "
                            f"and optim.micro_batches ({self.optim.micro_batches}) each minibatch")
        if max(self.data.buckets) < self.rollout.max_len - 1:
            raise TypeError(f"data.buckets {list(self.data.buckets)} must reach rollout.max_len - 1 = "
                            f"{self.rollout.max_len - 1} (a rollout may fill the engine's cache)")


# ------------------------------------------------------------------------------------------- inputs
def prompt_sources(paths: list[str]) -> tuple[SourceConfig, ...]:
    """Sources of `--prompts` files, the kind read from the first row (messages + rubrics: rubric; else qa);
    with both kinds the recipe's mix (QA 0.9, rubric 0.1, each split evenly over its files), else equal."""
    kinds = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), None)
        if first is None:
            raise DataError(f"{p}: no prompts (empty file)")
        try:
            row = json.loads(first)
        except json.JSONDecodeError as e:
            raise DataError(f"{p}:1: invalid JSON ({e})") from None
        kinds.append("rubric" if isinstance(row, dict) and "rubrics" in row else "qa")
    counts = collections.Counter(kinds)
    both = len(counts) == 2
    out = []
    for i, (p, k) in enumerate(zip(paths, kinds)):
        share = (QA_SHARE if k == "qa" else 1 - QA_SHARE) if both else 1.0
        out.append(SourceConfig(name=f"{k}{i}", path=str(p), kind=k, weight=share / counts[k]))
    return tuple(out)


def with_prompts(cfg: GRPOConfig, prompts: list[str] | None) -> GRPOConfig:
    """The config with `--prompts` files as its data sources, when given."""
    data = cfg.data if not prompts else dataclasses.replace(cfg.data, sources=prompt_sources(prompts))
    if not data.sources:
        raise DataError("grpo: no prompts: pass --prompts FILE or set data.sources in the config")
    return dataclasses.replace(cfg, data=data)


def load_prompts(cfg: GRPOConfig) -> list[list[dict[str, Any]]]:
    """Every source's rows of the training split, QA rows restricted to `data.qa_hops` (bad rows fail with
    file:line; a QA row without an integer `hops` when qa_hops is set names the file and the row's id)."""
    out, hops = [], cfg.data.qa_hops
    need = "data.qa_hops is set" if hops is not None else "data.stratify is 'hops'"
    for src in cfg.data.sources:
        rows, _ = load_source(src)
        split = cfg.data.train_split
        kept = [r for r in rows if split is None or r.get("split", split) == split]
        if not kept:
            raise DataError(f"grpo: {src.path}: no prompts with split {split!r} (set data.train_split: null to use "
                            "every row)")
        if (hops is not None or cfg.data.stratify == "hops") and src.kind == "qa":
            bad = [r.get("id") for r in kept if not isinstance(r.get("hops"), int)]
            if bad:
                raise DataError(f"grpo: {src.path}: {need} but {len(bad)} rows have no integer `hops` "
                                f"(e.g. id {bad[0]!r}); `data synth-qa` writes it")
        if hops is not None and src.kind == "qa":
            kept = [r for r in kept if r["hops"] in hops]
            if not kept:
                raise DataError(f"grpo: {src.path}: no {split!r} prompts with hops in {list(hops)}")
        out.append(kept)
    return out


def mix_sources(cfg: GRPOConfig, records: list[list[dict[str, Any]]]):
    """(sources, records, parents): the parts Grain mixes and the index in cfg.data.sources of each part's source.
    With data.stratify "hops" a QA source whose rows have hop counts h_1 < … < h_k becomes k parts, one per hop
    count, each of weight w/k (w: the source's weight); Grain's mix takes the parts in proportion to their weights,
    deterministically, so every hop count is drawn as often as the others and the batches alternate them (with two
    hop counts and four QA prompts a batch: two of each). Otherwise the sources as configured."""
    if cfg.data.stratify == "none":
        return cfg.data.sources, records, list(range(len(records)))
    sources, parts, parents = [], [], []
    for i, (src, rows) in enumerate(zip(cfg.data.sources, records)):
        hops = sorted({r["hops"] for r in rows}) if src.kind == "qa" else [None]
        for h in hops:
            part = rows if h is None else [r for r in rows if r["hops"] == h]
            name = src.name if h is None else f"{src.name}_hops{h}"
            sources.append(dataclasses.replace(src, name=name, weight=src.weight / len(hops)))
            parts.append(part)
            parents.append(i)
    return tuple(sources), parts, parents


def prompt_iterator(cfg: GRPOConfig, records: list[list[dict[str, Any]]]):
    """A checkpointable Grain iterator over batches of N (source index, record) pairs (`mix_sources`; the index
    is into cfg.data.sources): the same prompts on every process (the rollouts are replicated; each process trains
    on its rows)."""
    sources, parts, parents = mix_sources(cfg, records)
    pipe = PipelineConfig(sources=sources, seed=cfg.seed, batch_size=cfg.batch_size)
    mixed = mixed_records(pipe, parts, process_index=0, process_count=1)
    if cfg.data.stratify != "none":
        mixed = mixed.map(lambda pair: (parents[pair[0]], pair[1]))
    return iter(mixed.batch(cfg.batch_size, drop_remainder=True, batch_fn=list).to_iter_dataset())


def make_judge(cfg: RLData):
    from searchjax.rewards.rubrics import LLMJudge, OpenAIChatClient, RuleJudge

    if cfg.judge == "llm":
        return LLMJudge(OpenAIChatClient(cfg.judge_url, cfg.judge_model))
    return RuleJudge()


# ------------------------------------------------------------------------------------------- the loop
@dataclasses.dataclass
class Actors:
    """The rollout side: one engine, the policy and reference agents over it, the reward model."""

    engine: Any
    policy: SearchAgent
    reference: SearchAgent
    scorer: Any
    inputs: PreferenceInputs
    judge: Any


def _summary(values: np.ndarray, name: str) -> dict[str, float]:
    return {f"{name}/mean": float(values.mean()), f"{name}/std": float(values.std())}


def mixed_groups(r_base: np.ndarray) -> np.ndarray:
    """[N] bool: the groups of an [N, G] r_base with some rollouts right and some wrong, the only groups whose r_base
    advantage is not 0 (all right or all wrong, r_base − mean is 0 for every rollout)."""
    correct = np.asarray(r_base) > 0.5
    return correct.any(axis=-1) & ~correct.all(axis=-1)


def select_groups(mixed: list[np.ndarray], n: int) -> list[tuple[int, int]]:
    """Dynamic sampling's choice among one step's draws: (draw, row) of the n groups to train on, given each
    draw's [N] `mixed_groups` mask. The mixed groups come first, in draw order; when the draws hold fewer than n,
    the unmixed groups of the earliest draws fill the batch, so it keeps its N·G rows (one compiled train step).
    Returned in draw order."""
    found = [(d, int(i)) for d, m in enumerate(mixed) for i in np.flatnonzero(m)]
    rest = [(d, int(i)) for d, m in enumerate(mixed) for i in np.flatnonzero(~np.asarray(m, bool))]
    if len(found) + len(rest) < n:
        raise ValueError(f"select_groups: {n} groups asked of draws holding {len(found) + len(rest)}")
    return sorted((found + rest)[:n])


def preference_scored(cfg: RewardConfig) -> bool:
    """Whether R depends on the reward model's s: not under the linear ablation with weight 0 (R = r_base −
    pen_eff), where the loop skips the scorer."""
    return not (cfg.aggregation == "linear" and cfg.linear_weight == 0)


def rollout_metrics(prompts, groups, cache: ReferenceCache, r_base: np.ndarray, out) -> dict[str, float]:
    """Host-side metrics of one rollout batch (names as in the module of the issue: reward/…, penalty/…).
    reward/frac_mixed_groups: the share of groups with mixed r_base (`mixed_groups`); reward/base_qa_hops{h}: r_base
    of the batch's QA prompts of h hops (present when the batch has some; `data synth-qa` rows carry `hops`);
    prompts/{stratum}: how many of the batch's prompts are in each stratum (`prompt_strata`)."""
    flat = groups.flat()
    m = {**_summary(np.asarray(out.reward), "reward/score"),
         "reward/base": float(r_base.mean()), "reward/preference": float(np.asarray(out.preference).mean()),
         "penalty/tool": float(np.asarray(out.tool_penalty).mean()),
         "penalty/length": float(np.asarray(out.length_penalty).mean()),
         "penalty/eff": float(np.asarray(out.efficiency_penalty).mean()),
         **_summary(np.asarray(out.advantages), "advantages")}
    by = collections.defaultdict(list)  # metric name → the batch's prompts it averages r_base over
    for n, p in enumerate(prompts):
        by[f"reward/base_{p.kind}"].append(n)
        if p.kind == "qa" and isinstance(p.record.get("hops"), int):
            by[f"reward/base_qa_hops{p.record['hops']}"].append(n)
    m.update({name: float(r_base[rows].mean()) for name, rows in sorted(by.items())})
    m["reward/frac_mixed_groups"] = float(mixed_groups(r_base).mean())
    reward = np.asarray(out.reward)
    m["reward/frac_zero_std_groups"] = float((reward.std(axis=-1) <= 1e-6).mean())
    m["response_length"] = float(np.mean([r.response_length for r in flat]))
    m["ref_length"] = float(np.mean([ref.length for p in prompts for ref in cache[p.prompt_id]]))
    m["tool_calls"] = float(np.mean([r.tool_calls for r in flat]))
    m["failed_calls"] = float(np.mean([r.tool_failures for r in flat]))
    reasons = collections.Counter(r.finish_reason for r in flat)
    for reason in ("answer", "max_tokens", "context", "budget"):
        m[f"finish_reason/{reason}"] = reasons.get(reason, 0) / len(flat)
    m.update({f"prompts/{name}": float(n) for name, n in sorted(collections.Counter(prompt_strata(prompts)).items())})
    return m


def prompt_strata(prompts) -> list[str]:
    """Each prompt's stratum for advantage balancing and the advantages/mass_* metrics: "qa_hops{h}" for a QA
    prompt whose record has an integer `hops`, otherwise its kind ("qa" | "rubric")."""
    return [f"qa_hops{p.record['hops']}" if p.kind == "qa" and isinstance(p.record.get("hops"), int) else p.kind
            for p in prompts]


def balance_advantages(cfg: GRPOConfig, prompts, advantages) -> tuple[np.ndarray, dict[str, float]]:
    """(the [N, G] advantages the batch trains on, metrics). advantages/mass_{stratum}: the stratum's share of the
    batch's advantage mass Σ|Â| as computed (`prompt_strata`; logged whatever cfg.advantage_balance is); with
    advantage_balance "hops" the advantages are `stratum_balanced_advantages` and advantages/scale_{stratum}
    logs each stratum's scale c_k."""
    names = prompt_strata(prompts)
    order = sorted(set(names))
    strata = jnp.asarray([order.index(n) for n in names], jnp.int32)
    balanced, share, scale = stratum_balanced_advantages(jnp.asarray(advantages), strata, len(order),
                                                         max_scale=cfg.balance_max_scale)
    m = {f"advantages/mass_{n}": float(share[k]) for k, n in enumerate(order)}
    if cfg.advantage_balance == "none":
        return np.asarray(advantages, np.float32), m
    m.update({f"advantages/scale_{n}": float(scale[k]) for k, n in enumerate(order)})
    return np.asarray(balanced, np.float32), m


def calls_metrics(cfg: GRPOConfig, prompts, groups, out) -> dict[str, float]:
    """calls_cov/{term}: which term of R pushes the batch's tool calls, and which way (`calls_covariance`: mean
    over the batch's groups of cov(Â^term, calls); > 0 more calls, < 0 fewer), for term in correct, preference,
    tool, length and total (the Â computed, before any advantage balance); calls_cov/{term}_{stratum} the same
    over each stratum's groups (`prompt_strata`)."""
    cov = {k: np.asarray(v) for k, v in calls_covariance(out, groups.field("tool_calls"), cfg.rewards).items()}
    names = np.asarray(prompt_strata(prompts))
    m = {f"calls_cov/{k}": float(v.mean()) for k, v in cov.items()}
    for stratum in sorted(set(names)):
        m.update({f"calls_cov/{k}_{stratum}": float(v[names == stratum].mean()) for k, v in cov.items()})
    return m


def check_replicated(records, t: int) -> None:
    """Every process must have produced the same rollouts (each trains on its rows of them): compare a digest of
    every record's tokens, log-probs and routes across processes, and fail naming the step when they differ."""
    from jax.experimental import multihost_utils

    h = hashlib.sha256()
    for r in records:
        h.update(np.asarray(r.tokens, np.int32).tobytes())
        h.update(np.asarray(r.logprobs, np.float32).tobytes())
        if r.routes is not None:
            h.update(np.ascontiguousarray(r.routes, np.int16).tobytes())
    digest = np.frombuffer(h.digest(), np.uint32)
    multihost_utils.assert_equal(digest, fail_message=f"grpo step {t + 1}: the processes' rollouts differ (same "
                                                      "prompts, keys and weights must give the same tokens)")


class GRPOLoop:
    """One GRPO run's moving parts (the stage builds it; `fit` runs it)."""

    def __init__(self, cfg: GRPOConfig, actors: Actors, model_cfg, tokenizer, mesh, run, iterator, cache, tx):
        self.cfg, self.actors, self.mesh, self.run = cfg, actors, mesh, run
        self.iterator, self.cache, self.pad_id, self.tx = iterator, cache, tokenizer.special.pad, tx
        total = cfg.steps * cfg.minibatches
        aux = model_cfg.router_aux_loss_coef if cfg.router_aux_loss_coef is None else cfg.router_aux_loss_coef
        self.loss_fn = grpo_loss_fn(model_cfg, cfg.rewards, temperature=cfg.rollout.temperature,
                                    chunk=cfg.loss_chunk, aux_coef=aux, remat=cfg.remat,
                                    replay=cfg.rollout.routing_replay)
        self.lr_fn = lr_schedule(cfg.optim, total)
        self.old_logp = old_logprobs_fn(model_cfg, temperature=cfg.rollout.temperature, chunk=cfg.loss_chunk,
                                        mesh=mesh, replay=cfg.rollout.routing_replay) \
            if cfg.rewards.clip_eps is not None else None
        self.rewards = jax.jit(compute_rewards, static_argnames="cfg")
        self.root_key = jax.random.key(cfg.seed)
        self.ref_key = jax.random.fold_in(self.root_key, 0x5EF)

    # ---------------------------------------------------------------- pieces of a step
    def sync(self, state, step: int) -> None:
        """The engine's policy driver takes the state's weights (version = step), cast to its dtypes."""
        params = host_params(state.params) if jax.process_count() > 1 else state.params
        driver = self.actors.policy.driver
        driver.set_params(driver.cast_like(params), version=step)
        jax.block_until_ready(driver.params)

    def references(self, prompts: list[RLPrompt]) -> int:
        """Roll out and cache the reference rollouts (G paired, or one shared) of the prompts not cached yet;
        returns how many prompts."""
        new, seen = [], set()
        for p in prompts:
            if p.prompt_id not in self.cache and p.prompt_id not in seen:
                new.append(p)
                seen.add(p.prompt_id)
        if new:
            records = self.actors.reference.rollouts(
                [p.item for p in new], self.cfg.rollout.group_size, self.ref_key, REFERENCE,
                item_keys=[prompt_key(self.ref_key, p.prompt_id) for p in new], paired=not self.cache.shared)
            self.cache.add_records(records)
        return len(new)

    def base_rewards(self, prompts: list[RLPrompt], groups) -> np.ndarray:
        """r_base [N, G] of a batch of groups (`base_reward`: answer matching or the rubrics)."""
        return np.asarray([[base_reward(r, p, self.cfg.rewards, self.actors.judge) for r in row]
                           for p, row in zip(prompts, groups.grid)], np.float32)

    def rewards_of(self, prompts: list[RLPrompt], groups, key,
                   r_base: np.ndarray | None = None) -> tuple[Any, np.ndarray, np.ndarray]:
        """(breakdown, r_base [N, G], s [N, G]) of a batch of groups (r_base computed unless given). When R does
        not depend on s (`preference_scored`) the reward model is not run and s is ½."""
        cfg, g = self.cfg, self.cfg.rollout.group_size
        r_base = self.base_rewards(prompts, groups) if r_base is None else r_base
        if preference_scored(cfg.rewards):
            triples = self.actors.inputs.triples(prompts, groups.grid, self.cache, self.actors.scorer.needs_masks)
            pref = np.asarray(self.actors.scorer.score_ids(triples), np.float32).reshape(len(prompts), g)
        else:
            pref = np.full(r_base.shape, 0.5, np.float32)
        ref_len = np.asarray([[ref.length for ref in self.cache[p.prompt_id]] for p in prompts], np.float32)
        batch = RolloutRecords(correct=r_base, preference=pref, calls=groups.field("tool_calls"),
                               failures=groups.field("tool_failures"), lengths=groups.field("response_length"),
                               ref_lengths=ref_len, mask=np.ones_like(r_base, bool))
        return self.rewards(batch, cfg.rewards, key), r_base, pref

    def train(self, state, step_fn, arrays: dict[str, np.ndarray], key) -> tuple[Any, dict[str, float]]:
        """`minibatches` optimizer steps on the rollout batch; metrics averaged over them (the canary and *_max
        of the first, taken before any update)."""
        cfg, rows = self.cfg, arrays["input_ids"].shape[0]
        procs, me = jax.process_count(), jax.process_index()
        if self.old_logp is not None:  # log π_old of every row, before the first update (this process's rows,
            share = slice(me * rows // procs, (me + 1) * rows // procs)  # then gathered: all rows on every host)
            local = {k: arrays[k][share] for k in ("input_ids", "targets", "loss_mask", "lengths", "routes")
                     if k in arrays}
            arrays = {**arrays, "logp_old": host_params(self.old_logp(state.params, device_batch(local, self.mesh)))}
        order = np.arange(rows) if cfg.minibatches == 1 else \
            np.asarray(jax.random.permutation(key, rows))
        size = rows // cfg.minibatches
        collected: list[dict[str, float]] = []
        for j in range(cfg.minibatches):
            idx = order[j * size:(j + 1) * size]
            local = idx[me * size // procs:(me + 1) * size // procs]
            state, metrics = step_fn(state, device_batch({k: v[local] for k, v in arrays.items()}, self.mesh))
            collected.append({k: float(v) for k, v in jax.device_get(metrics).items()})
        first = collected[0]
        out = {k: float(np.mean([c[k] for c in collected])) for k in first}
        out.update({k: v for k, v in first.items() if k.startswith("canary/") or k.endswith("_max")})
        return state, out

    # ---------------------------------------------------------------- the step
    def prompts(self, batch, ids: collections.Counter | None = None) -> list[RLPrompt]:
        """The RL prompts of an iterator batch; the same prompt twice in a batch (a small source), or in the
        batches of one step sharing `ids`, gets its own id per occurrence."""
        kinds = [s.kind for s in self.cfg.data.sources]
        prompts = [RLPrompt.of(rec, kinds[i], self.cfg.rollout.budget) for i, rec in batch]
        ids = collections.Counter() if ids is None else ids
        for n, p in enumerate(prompts):
            ids[p.prompt_id] += 1
            if ids[p.prompt_id] > 1:
                prompts[n] = dataclasses.replace(p, item=dataclasses.replace(
                    p.item, prompt_id=f"{p.prompt_id}#{ids[p.prompt_id] - 1}"))
        return prompts

    def rollout_key(self, t: int) -> jax.Array:
        """The key of rollout batch t's policy rollouts (a pure function of the seed and t)."""
        return jax.random.fold_in(jax.random.fold_in(self.root_key, t + 1), 0)

    def make_step_fn(self, state):
        """The jitted, donated train step over `state`'s layout."""
        cfg = self.cfg
        return make_train_step(self.loss_fn, self.tx, micro_batches=cfg.optim.micro_batches,
                               compute_dtype=cfg.compute_dtype, lr_fn=self.lr_fn,
                               state_shardings=jax.tree.map(lambda x: x.sharding, state), mesh=self.mesh)

    def roll(self, prompts: list[RLPrompt], t: int, draw: int = 0):
        """The policy's G rollouts of each prompt as groups, with rollout batch t's key (draw d > 0 of a
        filtered step: fold_in(key, d))."""
        g, key = self.cfg.rollout.group_size, self.rollout_key(t)
        records = self.actors.policy.rollouts([p.item for p in prompts], g,
                                              key if draw == 0 else jax.random.fold_in(key, draw))
        groups = group_records(records, g, [p.prompt_id for p in prompts])
        if jax.process_count() > 1:
            check_replicated(groups.flat(), t)
        return groups

    def collect(self, prompts: list[RLPrompt], t: int,
                drawn=None) -> tuple[Any, Any, np.ndarray, int, dict[str, float]]:
        """Rollout batch t's (0-based) reference rollouts (new prompts only), policy rollouts and rewards:
        (groups, reward breakdown, r_base [N, G], how many prompts were new to the reference cache, timing_s/*).
        drawn: (groups, r_base, rollout seconds) already rolled out for `prompts` (`draw`)."""
        timing = {}
        t0 = time.perf_counter()
        new = self.references(prompts)
        timing["timing_s/reference"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        groups, r_base, seconds = drawn if drawn is not None else (self.roll(prompts, t), None, None)
        timing["timing_s/rollout"] = time.perf_counter() - t0 if seconds is None else seconds

        t0 = time.perf_counter()
        key = jax.random.fold_in(self.root_key, t + 1)  # the step's key; the train step takes fold_in(key, 2)
        out, r_base, _ = self.rewards_of(prompts, groups, jax.random.fold_in(key, 1), r_base)
        timing["timing_s/reward"] = time.perf_counter() - t0
        return groups, out, r_base, new, timing

    def draw(self, prompts: list[RLPrompt], t: int, ids: collections.Counter):
        """Dynamic sampling (cfg.filter_groups): roll out batch after batch of the iterator (the first is
        `prompts`) until the draws hold N groups with mixed r_base or cfg.filter_max_draws batches were drawn;
        returns (the N prompts kept, (their groups, r_base [N, G], rollout seconds), filter/* metrics, every
        drawn rollout's tokens). filter/draws: batches rolled out; filter/frac_mixed_drawn: the share of drawn
        groups with mixed r_base; filter/filled: unmixed groups in the batch (too few mixed ones were found)."""
        cfg, n, t0 = self.cfg, len(prompts), time.perf_counter()
        draws = []
        while True:
            groups = self.roll(prompts, t, len(draws))
            draws.append((prompts, groups, self.base_rewards(prompts, groups)))
            found = sum(int(mixed_groups(r).sum()) for *_, r in draws)
            if found >= n or len(draws) == cfg.filter_max_draws:
                break
            prompts = self.prompts(next(self.iterator), ids)
        keep = select_groups([mixed_groups(r) for *_, r in draws], n)
        kept = [draws[d][0][i] for d, i in keep]
        groups = group_records([r for d, i in keep for r in draws[d][1].grid[i]], cfg.rollout.group_size,
                               [p.prompt_id for p in kept])
        r_base = np.stack([draws[d][2][i] for d, i in keep])
        m = {"filter/draws": float(len(draws)), "filter/frac_mixed_drawn": found / (n * len(draws)),
             "filter/filled": float(max(n - found, 0))}
        tokens = sum(r.response_length for _, g, _ in draws for r in g.flat())
        return kept, (groups, r_base, time.perf_counter() - t0), m, tokens

    def step(self, state, step_fn, t: int) -> tuple[Any, dict[str, float]]:
        """Rollout batch t (0-based) → one training step's worth of updates; returns (state, metrics)."""
        cfg, ids = self.cfg, collections.Counter()
        prompts = self.prompts(next(self.iterator), ids)
        key = jax.random.fold_in(self.root_key, t + 1)
        drawn, filter_m, tokens = None, {}, None
        if cfg.filter_groups:
            prompts, drawn, filter_m, tokens = self.draw(prompts, t, ids)
        groups, out, r_base, new, timing = self.collect(prompts, t, drawn)
        tokens = sum(r.response_length for r in groups.flat()) if tokens is None else tokens

        t0 = time.perf_counter()
        advantages, balance_m = balance_advantages(cfg, prompts, out.advantages)
        arrays = train_arrays(groups.flat(), advantages.reshape(-1), pad_id=self.pad_id, buckets=cfg.data.buckets)
        state, train_m = self.train(state, step_fn, arrays, jax.random.fold_in(key, 2))
        timing["timing_s/train"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        self.sync(state, t + 1)
        timing["timing_s/sync"] = time.perf_counter() - t0

        m = rollout_metrics(prompts, groups, self.cache, r_base, out)
        if not preference_scored(cfg.rewards):
            del m["reward/preference"]  # not scored (s = ½ everywhere)
        m.update(filter_m)
        m.update(_summary(advantages, "advantages"))  # what the batch trained on
        m.update(balance_m)
        m.update(calls_metrics(cfg, prompts, groups, out))
        m.update(train_m)
        m.update(timing)
        m["timing_s/step"] = sum(timing.values())
        m["perf/tokens_per_s"] = tokens / max(timing["timing_s/rollout"], 1e-9)
        m["weights/version"] = float(self.actors.policy.driver.version)
        m["engine/traces"] = float(sum(self.actors.engine.trace_counts.values()))
        m["reference/new_prompts"] = float(new)
        m["reference/new_rollouts"] = float(new * self.cache.per_prompt)
        m["reference/cached_prompts"] = float(len(self.cache))
        m["data/width"] = float(arrays["input_ids"].shape[1])
        return state, m


def fit(loop: GRPOLoop, state, start: int, checkpointer: Checkpointer, meta: dict[str, Any]):
    """Rollout batches start..cfg.steps−1, logging every step, saving on the cadence (and on Ctrl-C/SIGTERM)."""
    cfg = loop.cfg
    step_fn = loop.make_step_fn(state)
    logger = MetricsLogger(loop.run.root, cfg.steps, start_step=start, resuming=loop.run.resuming,
                           progress=cfg.progress, desc="grpo")
    step, last, saved_at = start, {}, None
    position = loop.iterator.get_state()
    try:
        while step < cfg.steps:
            position = loop.iterator.get_state()  # an interrupt mid-step saves the iterator from before it
            state, m = loop.step(state, step_fn, step)
            step += 1
            position = loop.iterator.get_state()  # the step is done: an interrupt from here on keeps its batch
            if step == cfg.steps or (cfg.save_every and step % cfg.save_every == 0):
                t0 = time.perf_counter()
                checkpointer.save(step, state, loop.iterator, {**meta, "reference_cache": loop.cache.to_json()})
                saved_at = step
                m["timing_s/checkpoint"] = time.perf_counter() - t0
            logger.advance()
            if step % cfg.log_every == 0 or step == cfg.steps or step == start + 1:
                last = logger.log(step, m) or m
        checkpointer.wait()
    except KeyboardInterrupt:
        if step > start and saved_at != step and not any(x.is_deleted() for x in jax.tree.leaves(state)):
            print(f"\ninterrupted: saving step {step} to {checkpointer.directory} before exiting", flush=True)
            loop.iterator.set_state(position)
            checkpointer.save(step, state, loop.iterator, {**meta, "reference_cache": loop.cache.to_json()})
            checkpointer.wait()
        raise
    finally:
        logger.close()
    return state, last


# ------------------------------------------------------------------------------------------- the stage
def _same_tokenizer(a: Path, b: Path, what: str) -> None:
    if a.read_bytes() != b.read_bytes():
        raise DataError(f"{what}: {b} differs from the policy's {a}; the policy, reference and reward model must "
                        "share one tokenizer (the rollouts' token ids are scored as they are)")


def build_actors(cfg: GRPOConfig, start, reference: Path, reward_model: Path, backend, params) -> Actors:
    """The engine (on this process's first device), the policy and reference drivers and agents, the scorer."""
    from searchjax.model import load_hf, read_hf_config
    from searchjax.rollout import RolloutDriver, SearchJaxEngine
    from searchjax.rollout.preference import PreferenceScorer
    from searchjax.sharding import make_mesh

    r = cfg.rollout
    ref_cfg = read_hf_config(reference)
    if ref_cfg != start.cfg:
        raise DataError(f"--reference {reference}: its config.json differs from the policy's ({start.path}); the "
                        "reference must be the same architecture (normally the SFT checkpoint itself)")
    _same_tokenizer(start.path / "tokenizer.json", reference / "tokenizer.json", "--reference")
    _same_tokenizer(start.path / "tokenizer.json", reward_model / "tokenizer.json", "--reward-model")
    mesh = make_mesh({"fsdp": 1}, devices=jax.local_devices()[:1])
    ref_params = load_hf(reference, dtype=r.dtype, mesh=mesh)[1]
    engine = SearchJaxEngine(start.cfg, ref_params, start.tokenizer, max_concurrent_decodes=r.slots,
                             max_prefill_length=r.max_prefill_length, max_len=r.max_len, cache_dtype=r.dtype,
                             sampling=r.agent().sampling, mesh=mesh, record_routes=True)
    ref_driver = RolloutDriver(engine, ref_params, extend_cache=r.extend_cache)
    engine_dtype = jax.tree.map(lambda p: p.astype(jnp.dtype(r.dtype)), params)
    policy_driver = RolloutDriver(engine, engine_dtype, extend_cache=r.extend_cache)
    scorer = PreferenceScorer.load(reward_model, mesh=mesh, batch_pairs=cfg.scorer_batch_pairs,
                                   buckets=cfg.scorer_buckets)
    agent_cfg = r.agent()
    return Actors(engine=engine, policy=SearchAgent(policy_driver, backend, agent_cfg),
                  reference=SearchAgent(ref_driver, backend, agent_cfg), scorer=scorer,
                  inputs=PreferenceInputs(start.tokenizer.encode, r.enable_thinking, cfg.scorer_likelihood_turns),
                  judge=make_judge(cfg.data))


@dataclasses.dataclass
class Prepared:
    """A GRPO run ready to go: the loop, the (fresh or restored) state and its step, the checkpointer and the
    checkpoint metadata, the starting model."""

    loop: GRPOLoop
    state: Any
    begin: int
    checkpointer: Checkpointer
    meta: dict[str, Any]
    start: Any


def check_process_split(cfg: GRPOConfig, processes: int) -> None:
    """Each optimizer step takes N·G / minibatches rollouts, split evenly over the processes (each trains its
    share): a remainder would silently drop rollouts, so it is refused before anything is loaded."""
    size = cfg.batch_size * cfg.rollout.group_size // cfg.minibatches
    if size % processes:
        raise ConfigError(f"grpo: a minibatch holds batch_size · rollout.group_size / minibatches = "
                          f"{cfg.batch_size} · {cfg.rollout.group_size} / {cfg.minibatches} = {size} rollouts, "
                          f"not a multiple of the {processes} processes")


def prepare_grpo(cfg: GRPOConfig, policy: str | Path, reference: str | Path, reward_model: str | Path, backend,
                 out: str | Path, overwrite: bool = False) -> Prepared:
    """Everything `run_grpo` trains with (inputs checked first, then models loaded, the run directory prepared
    and a checkpoint restored when it holds one)."""
    from searchjax.train.causal import start_model

    records = load_prompts(cfg)  # bad rows fail here, before any model is loaded
    check_process_split(cfg, jax.process_count())
    for path, flag in ((reference, "--reference"), (reward_model, "--reward-model")):
        if not (Path(path) / "config.json").is_file() or not (Path(path) / "tokenizer.json").is_file():
            raise DataError(f"{flag} {path}: not a checkpoint directory (config.json and tokenizer.json expected)")
    mesh = run_mesh(cfg)
    start = start_model(policy, mesh)
    run = prepare_run_dir(out, "grpo", cfg, overwrite)
    iterator = prompt_iterator(cfg, records)
    cache = ReferenceCache(cfg.rollout.group_size, shared=cfg.rollout.reference == "shared")
    tx = make_optimizer(cfg.optim, cfg.steps * cfg.minibatches)
    ckpt = Checkpointer(run.checkpoints, cfg.checkpoint)
    meta = {"stage": "grpo", "config": to_dict(cfg), "process_count": jax.process_count(),
            "model": str(start.path), "reference": str(reference), "reward_model": str(reward_model)}
    restored = ckpt.restore(abstract_state(tx, start.abstract, start.shardings, mesh), iterator) \
        if run.resuming else None
    if restored is not None:
        begin, state, saved = restored
        # prepare_run_dir refuses a resume whose config differs, so the cache's G and paired/shared are the config's
        cache = ReferenceCache.from_json(saved["reference_cache"])
        print(f"grpo: resuming {run.root} from step {begin} ({len(cache)} cached reference prompts)", flush=True)
    else:
        begin, state = 0, create_state(start.load(), tx, cfg.seed, mesh, start.shardings)
    params = host_params(state.params) if jax.process_count() > 1 else state.params
    actors = build_actors(cfg, start, Path(reference), Path(reward_model), backend, params)
    actors.policy.driver.version = begin
    loop = GRPOLoop(cfg, actors, start.cfg, start.tokenizer, mesh, run, iterator, cache, tx)
    return Prepared(loop, state, begin, ckpt, meta, start)


def run_grpo(cfg: GRPOConfig, policy: str | Path, reference: str | Path, reward_model: str | Path, backend,
             out: str | Path, overwrite: bool = False) -> dict[str, Any]:
    """Train GRPO from the HF checkpoint `policy` (reference and reward model as given) into the run directory
    `out`, resuming it when it holds this run; returns the summary (also RUN/summary.json)."""
    from searchjax.train.causal import hf_export
    from searchjax.train.runner import export_final_params

    p = prepare_grpo(cfg, policy, reference, reward_model, backend, out, overwrite)
    run, start, begin = p.loop.run, p.start, p.begin
    t0 = time.perf_counter()
    try:
        state, last = fit(p.loop, p.state, begin, p.checkpointer, p.meta)
    finally:
        p.checkpointer.close()
    train_s = time.perf_counter() - t0
    export_final_params(run.final, state.params, hf_export(start.cfg, start.path / "tokenizer.json"))
    summary = {"stage": "grpo", "steps": cfg.steps, "resumed_from": begin, "train_s": round(train_s, 2),
               "final": str(run.final), "last_metrics": last}
    if jax.process_index() == 0:
        atomic_write_text(run.root / "summary.json", json.dumps(summary, indent=2, default=float) + "\n")
    return summary


# The stage interface of searchjax.train.stages (GRPO has its own command line: see searchjax.cli.train).
Config = GRPOConfig
run = run_grpo
