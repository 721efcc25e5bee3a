"""GRPO's pieces between the rollouts and the train step: prompts, base rewards, the reference cache, the
preference inputs, the training batch and the policy loss (RECIPE.md §2, §4).

Base reward by data kind (r_base ∈ {0, 1}):

    qa       1 iff the rollout ended with an answer (finish_reason "answer") and `qa_correct(answer, aliases)`
    rubric   1 iff it ended with an answer and every rubric passes (`passes_all`, the configured judge)

A rollout cut short (max_tokens, context, budget) has no final answer and gets r_base = 0.

Reference rollouts (RECIPE.md §4 decision): G per prompt from the frozen reference policy, paired with the
policy's by index, generated once per prompt id and cached (`ReferenceCache`; saved in every checkpoint); or,
with the cheaper switch (`rollout.reference: shared`), one per prompt that the whole group is compared with. Their
keys derive from the prompt id, not from the prompt's place in a batch.

Training batch of one rollout batch, B = N·G rows in row-major group order (row n·G + i = rollout i of prompt n):

    input_ids[b, t] = tokens[b, t],  targets[b, t] = tokens[b, t+1],  loss_mask[b, t] = mask[b, t+1]
    logp_infer[b, t] = log μ(tokens[b, t+1]),  advantages[b] = Â_b,  lengths[b] = |tokens_b| − 1
    routes[b, t] = the experts the engine sent tokens[b, t] to, [L, k] per position (when recorded)

The loss (`grpo_loss_fn`) recomputes log π with the sampler's temperature T in the chunked log-prob path,

    log π_T(y | ·) = log_softmax(h·Wᵀ / T)[y] = token_logprobs(h / T, W, y)       (never [B, T, V] logits)

and returns `policy_loss` (token-level IS, or its ablations) plus the canary |log π − log μ| over valid tokens,
which is ≤ 1e-4 in float32 when the trainer's params are the sampler's (RECIPE.md §2) and every token goes to
the experts it went to in the engine. Top-k routing is discontinuous: where the router's top-k has a near-tie
(a margin of ~1e-8, which float rounding breaks differently in the engine's chunked prefill and decode than in
one full forward), a token can go to another expert and every later log-probability moves by up to ~1e-2
(RESULTS.md, the canary). `replay=True` (routing replay, the write-up's rejected alternative, RECIPE.md §2) routes
every token as the engine did; either way rollout_corr/route_mismatch is the share of (token, layer) pairs whose
trainer top-k differs from the engine's.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from searchjax.chat.template import IM_START, render
from searchjax.losses.grpo import policy_loss
from searchjax.losses.logprobs import token_logprobs
from searchjax.model import ModelConfig
from searchjax.model.transformer import hidden_states
from searchjax.rewards.answers import qa_correct
from searchjax.rewards.config import RewardConfig
from searchjax.rewards.rubrics import Judge, Rubric, passes_all
from searchjax.rollout.agent import TOOLS, PromptItem
from searchjax.rollout.records import RolloutRecord, to_arrays
from searchjax.train.step import per_shard, shards_explicitly

KINDS = ("qa", "rubric")
TRAIN_KEYS = ("input_ids", "targets", "loss_mask", "logp_infer", "advantages", "lengths")


@dataclasses.dataclass(frozen=True)
class RLPrompt:
    """One RL prompt: what the agent rolls out (`item`), its data kind ("qa" | "rubric") and its source record
    (the gold answer and aliases, or the rubrics)."""

    item: PromptItem
    kind: str
    record: Mapping[str, Any]

    @classmethod
    def of(cls, record: Mapping[str, Any], kind: str, budget: int) -> "RLPrompt":
        if kind not in KINDS:
            raise ValueError(f"RL prompt {record.get('id')!r}: kind {kind!r} is not one of {list(KINDS)}")
        return cls(PromptItem.from_record(record, budget), kind, record)

    @property
    def prompt_id(self) -> str:
        return self.item.prompt_id


def gold_answers(record: Mapping[str, Any]) -> list[str]:
    """The gold answer followed by its aliases (a QA record of `data synth-qa`)."""
    return [str(record["answer"]), *[str(a) for a in record.get("aliases", ()) if str(a) != str(record["answer"])]]


def base_reward(rollout: RolloutRecord, prompt: RLPrompt, cfg: RewardConfig, judge: Judge) -> float:
    """r_base of one rollout by its prompt's kind (module docstring)."""
    if rollout.finish_reason != "answer":
        return 0.0
    if prompt.kind == "qa":
        ok = qa_correct(rollout.answer, gold_answers(prompt.record), rel_tol=cfg.answer_rel_tol,
                        abs_tol=cfg.answer_abs_tol, f1_threshold=cfg.answer_f1_threshold)
    else:
        rubrics = [Rubric.from_dict(r) for r in prompt.record["rubrics"]]
        ok = passes_all(prompt.item.question, rollout.answer, rubrics, judge)
    return float(ok)


def prompt_key(root: jax.Array, prompt_id: str) -> jax.Array:
    """A key for `prompt_id` alone: fold_in(root, first 31 bits of sha256(prompt_id))."""
    digest = int.from_bytes(hashlib.sha256(prompt_id.encode()).digest()[:4], "little") & 0x7FFFFFFF
    return jax.random.fold_in(root, digest)


@dataclasses.dataclass(frozen=True)
class ReferenceRollout:
    """What the reward needs of a reference rollout: its generated part (ids after the prompt), its length in
    policy tokens (L^ref), its answer, and which ids of `response` the policy generated (the loss mask; for a reward
    model with the likelihood term; None in caches saved before it was kept)."""

    response: tuple[int, ...]
    length: int
    answer: str
    mask: tuple[int, ...] | None = None

    @classmethod
    def of(cls, record: RolloutRecord) -> "ReferenceRollout":
        return cls(tuple(record.tokens[record.prompt_length:]), record.response_length, record.answer,
                   tuple(record.loss_mask[record.prompt_length:]))


class ReferenceCache:
    """prompt id → its G reference rollouts (index i pairs with the policy's rollout i). JSON-able for the
    checkpoint metadata (`to_json` / `from_json`).

    shared=True (RECIPE.md §4, the cheaper switch): one reference rollout per prompt (a record with group_index
    −1), which every policy rollout of the group is compared with: `cache[pid]` returns it G times, so
    s_i = P̄(x, y_i, y_ref) and every L_j^ref = L_ref, which makes b_win = b_lose = L_ref and L^cmp = L_ref.
    """

    def __init__(self, group_size: int, entries: Mapping[str, Sequence[ReferenceRollout]] | None = None,
                 shared: bool = False):
        self.group_size, self.shared = group_size, shared
        self.per_prompt = 1 if shared else group_size
        self.entries: dict[str, tuple[ReferenceRollout, ...]] = {}
        for pid, refs in (entries or {}).items():
            self.put(pid, refs)

    def __contains__(self, prompt_id: str) -> bool:
        return prompt_id in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, prompt_id: str) -> tuple[ReferenceRollout, ...]:
        """The G references of the prompt's group, by policy index (the shared one G times)."""
        refs = self.entries[prompt_id]
        return refs * self.group_size if self.shared else refs

    def put(self, prompt_id: str, refs: Sequence[ReferenceRollout]) -> None:
        if len(refs) != self.per_prompt:
            what = "shared: 1" if self.shared else f"G = {self.group_size}"
            raise ValueError(f"reference cache: {len(refs)} reference rollouts for {prompt_id!r}, expected "
                             f"{what}")
        self.entries[prompt_id] = tuple(refs)

    def add_records(self, records: Sequence[RolloutRecord]) -> None:
        """Cache reference records: group_index 0..G−1 of each prompt, any order (paired), or one record with
        group_index −1 per prompt (shared)."""
        lo, hi = (-1, 0) if self.shared else (0, self.group_size)
        by_prompt: dict[str, dict[int, RolloutRecord]] = {}
        for r in records:
            if not lo <= r.group_index < hi or r.group_index in by_prompt.get(r.prompt_id, {}):
                what = "shared reference rollout (group_index -1)" if self.shared else \
                    f"paired reference rollout (group_index in [0, {self.group_size}))"
                raise ValueError(f"reference cache: record {r.prompt_id}/{r.group_index} is not a new {what}")
            by_prompt.setdefault(r.prompt_id, {})[r.group_index] = r
        for pid, rows in by_prompt.items():
            if len(rows) != self.per_prompt:
                raise ValueError(f"reference cache: prompt {pid!r} has {len(rows)} of {self.per_prompt} rollouts")
            self.put(pid, [ReferenceRollout.of(rows[i]) for i in sorted(rows)])

    def to_json(self) -> dict[str, Any]:
        return {"group_size": self.group_size, "shared": self.shared,
                "entries": {pid: [[list(r.response), r.length, r.answer, None if r.mask is None else list(r.mask)]
                                  for r in refs]
                            for pid, refs in self.entries.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ReferenceCache":
        entries = {pid: [ReferenceRollout(tuple(e[0]), int(e[1]), str(e[2]),
                                          None if len(e) < 4 or e[3] is None else tuple(e[3])) for e in refs]
                   for pid, refs in data["entries"].items()}
        return cls(int(data["group_size"]), entries, shared=bool(data.get("shared", False)))


def opened_turn_mask(ids: Sequence[int], mask: Sequence[int], gen: Sequence[int], opened: int) -> list[int]:
    r"""`mask` (a rollout's loss mask over `ids`) with the last `opened` tokens of every occurrence of the generation
    prompt `gen` in `ids` set to 1.

    The driver appends the generation prompt "<|im_start|>assistant\n<think>\n" before each turn, so a rollout's
    loss mask is 0 on its "<think>\n"; the chat template's masks (the ones the reward model's likelihood term was
    trained with, searchjax.data.preferences.encode_prompt_response) count it as the start of the assistant's body.
    """
    out, n = [int(m) for m in mask], len(gen)
    if opened:
        for p in range(len(ids) - n + 1):
            if list(ids[p:p + n]) == list(gen):
                out[p + n - opened:p + n] = [1] * opened
    return out


def last_turn_mask(ids: Sequence[int], mask: Sequence[int], header: Sequence[int]) -> list[int]:
    """`mask` with every entry before the last occurrence of the turn header `header` in `ids` set to 0: only the
    last turn's tokens stay marked (all of `mask` when the header never occurs)."""
    n, start = len(header), 0
    for p in range(len(ids) - n, -1, -1):
        if list(ids[p:p + n]) == list(header):
            start = p
            break
    return [0] * start + [int(m) for m in mask[start:]]


class PreferenceInputs:
    r"""Token-id triples (x, a, b) for the reward model from rollout records, in the layout the reward model was
    trained on (`searchjax.data.preferences.encode_prompt_response`): x is the prompt rendered without the tool
    schema, through its last <|im_end|>\n; a and b are the generation prompt followed by everything the rollout
    appended after its prompt (its turns, tool calls and tool responses, token for token). With masks, each
    response's assistant mask as the template's: the generated tokens and each turn's opening after
    "<|im_start|>assistant\n" (`opened_turn_mask`).

    likelihood_turns: which assistant turns the mask marks, i.e. whose log-likelihood a reward model's likelihood
    term sums (searchjax.rewards.reward_model). "last": only the final turn (the answer and its thinking), as in
    the preference pairs `searchjax data preferences` writes, whose responses are the final turn with the searches
    in the prompt; "all": every turn, search calls included, so the sum grows with every search (on the science
    pipeline's reward model, by about 14 logits of Δ̄ per search at the SFT weights: RESULTS.md, session 30)."""

    def __init__(self, encode, enable_thinking: bool = True, likelihood_turns: str = "last"):
        if likelihood_turns not in ("last", "all"):
            raise ValueError(f"likelihood_turns: expected 'last' or 'all', got {likelihood_turns!r}")
        self.encode, self.enable_thinking, self.likelihood_turns = encode, enable_thinking, likelihood_turns
        self._cache: dict[str, tuple[list[int], list[int]]] = {}
        self._header = encode(IM_START + "assistant\n")

    def prompt(self, item: PromptItem) -> tuple[list[int], list[int]]:
        """(x ids, generation-prompt ids) of an item."""
        got = self._cache.get(item.prompt_id)
        if got is None:
            msgs = list(item.messages)
            x = self.encode(render(msgs, None, add_generation_prompt=False))
            head = render(msgs, list(TOOLS), add_generation_prompt=False)
            full = render(msgs, list(TOOLS), add_generation_prompt=True, enable_thinking=self.enable_thinking)
            got = self._cache[item.prompt_id] = (x, self.encode(full[len(head):]))
        return got

    def opened(self, gen: Sequence[int]) -> int:
        """How many trailing tokens of the generation prompt the template's masks count as the assistant's."""
        h = len(self._header)
        if list(gen[:h]) != list(self._header):
            raise ValueError(f"the generation prompt's ids {list(gen)} do not start with the turn header's "
                             f"{self._header}: the tokenizer merges across it")
        return len(gen) - h

    def triples(self, prompts: Sequence[RLPrompt], grid: Sequence[Sequence[RolloutRecord]],
                cache: ReferenceCache, masks: bool = False) -> list[tuple[list[int], ...]]:
        """Row-major (n·G + i) triples: x of prompt n, a = policy rollout i, b = reference rollout i; with masks
        (a reward model with the likelihood term) also each response's assistant mask (the records' loss mask with
        every turn's opening marked, class docstring)."""
        out = []
        for prompt, row in zip(prompts, grid):
            x, gen = self.prompt(prompt.item)
            refs = cache[prompt.prompt_id]
            for rec, ref in zip(row, refs):
                a, b = gen + list(rec.tokens[rec.prompt_length:]), gen + list(ref.response)
                triple = (x, a, b)
                if masks:
                    if ref.mask is None:
                        raise ValueError(f"reference cache: prompt {prompt.prompt_id!r} has no loss masks (a cache "
                                         "saved before they were kept); the likelihood term needs them")
                    zero, opened = [0] * len(gen), self.opened(gen)
                    pair = (opened_turn_mask(a, zero + list(rec.loss_mask[rec.prompt_length:]), gen, opened),
                            opened_turn_mask(b, zero + list(ref.mask), gen, opened))
                    if self.likelihood_turns == "last":
                        pair = (last_turn_mask(a, pair[0], self._header), last_turn_mask(b, pair[1], self._header))
                    triple += pair
                out.append(triple)
        return out


def width_bucket(longest: int, buckets: Sequence[int]) -> int:
    """The smallest bucket ≥ longest (the padded width of a training batch); ValueError past the largest."""
    for b in sorted(buckets):
        if b >= longest:
            return b
    raise ValueError(f"a rollout of {longest} tokens is longer than the largest training bucket {max(buckets)}")


def train_arrays(records: Sequence[RolloutRecord], advantages: np.ndarray, *, pad_id: int,
                 buckets: Sequence[int]) -> dict[str, np.ndarray]:
    """The training batch of the module docstring (numpy; rows in `records` order), width = a bucket."""
    arr = to_arrays(records, pad_id=pad_id)
    longest = int(arr["lengths"].max()) - 1
    width = width_bucket(max(longest, 1), buckets)
    n = len(records)
    out = {
        "input_ids": np.full((n, width), pad_id, np.int32),
        "targets": np.full((n, width), pad_id, np.int32),
        "loss_mask": np.zeros((n, width), np.int32),
        "logp_infer": np.zeros((n, width), np.float32),
    }
    t = arr["tokens"].shape[1]
    w = min(width, t - 1)
    out["input_ids"][:, :w] = arr["tokens"][:, :w]
    out["targets"][:, :w] = arr["tokens"][:, 1:w + 1]
    out["loss_mask"][:, :w] = arr["loss_mask"][:, 1:w + 1]
    out["logp_infer"][:, :w] = arr["logprobs"][:, 1:w + 1]
    if "routes" in arr:
        out["routes"] = np.full((n, width, *arr["routes"].shape[2:]), -1, np.int16)
        out["routes"][:, :w] = arr["routes"][:, :w]
    out["advantages"] = np.asarray(advantages, np.float32).reshape(n)
    out["lengths"] = np.maximum(arr["lengths"] - 1, 1).astype(np.int32)
    return out


def route_mismatch(own: jax.Array, recorded: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(share, rows): the share of (valid position, layer) pairs where the sets of experts `own` and `recorded`
    [B,T,L,k] differ, and [B] bool, the rows with at least one such pair; positions whose recorded row is −1
    (never fed by the engine) do not count."""
    differ = jnp.any(jnp.sort(own, axis=-1) != jnp.sort(recorded.astype(own.dtype), axis=-1), axis=-1)
    counted = valid[:, :, None] & (recorded[..., 0] >= 0)
    hit = jnp.where(counted, differ, False)
    return hit.sum() / jnp.maximum(counted.sum(), 1), jnp.any(hit, axis=(1, 2))


def _replayed(batch, replay: bool):
    """The routes `hidden_states` replays: the batch's recorded ones with replay=True, else None."""
    if replay and "routes" not in batch:
        raise ValueError("routing replay: the training batch has no routes (the engine must record them)")
    return batch["routes"] if replay else None


def grpo_loss_fn(model_cfg: ModelConfig, reward_cfg: RewardConfig, *, temperature: float, chunk: int = 4096,
                 aux_coef: float = 0.0, remat: bool = False, replay: bool = False):
    """loss_fn(params, batch, key) for `make_train_step` over the training batch (module docstring).

    Metrics: actor/pg_loss, actor/entropy (the sampled-token estimate −E[log π] over valid tokens),
    rollout_corr/{kl, is_mean, is_max, frac_truncated} (from `policy_loss`: kl = mean log μ − log π),
    rollout_corr/ess (the effective sample size of the token weights w = π/μ as a share: (Σw)² / (n Σw²)),
    canary/logp_abs_diff_mean and canary/logp_abs_diff_max (|log π − log μ| over valid tokens), router_aux,
    rollout_corr/route_mismatch (`route_mismatch`, when the batch has routes; replay=True routes as they say) and
    canary/logp_abs_diff_max_same_routes (the canary over the rows whose every token the trainer's router sent
    where the engine's did: ≤ 1e-4 whatever the routing flips, so a weight-sync or numerics bug still shows);
    weight = the rows with a trained token (the loss is a mean over them, so micro-batches combine exactly).
    With `batch["logp_old"]` (several optimizer steps per rollout batch) the PPO clip of reward_cfg applies.
    """
    if not temperature > 0:
        raise ValueError(f"grpo: the sampling temperature must be > 0 (greedy decoding has no log-probability "
                         f"to learn from), got {temperature}")
    inv_t = 1.0 / float(temperature)

    def loss_fn(params, batch, key):
        del key
        ids = batch["input_ids"]
        valid = jnp.arange(ids.shape[1])[None, :] < batch["lengths"][:, None]
        h, aux = hidden_states(params, ids, model_cfg, remat=remat, return_aux=True, valid=valid,
                               routes=_replayed(batch, replay))
        logp = token_logprobs(h.astype(jnp.float32) * inv_t, params.unembed, batch["targets"], chunk=chunk)
        mask = batch["loss_mask"].astype(bool)
        loss, m = policy_loss(logp, batch["logp_infer"], batch["advantages"], mask, reward_cfg,
                              logp_old=batch.get("logp_old"))
        n_tok = jnp.maximum(mask.sum(), 1)
        diff = jnp.where(mask, jnp.abs(jax.lax.stop_gradient(logp) - batch["logp_infer"]), 0.0)
        ratio = jnp.where(mask, jnp.exp(jax.lax.stop_gradient(logp) - batch["logp_infer"]), 0.0)
        ess = ratio.sum() ** 2 / (n_tok * jnp.maximum((ratio ** 2).sum(), 1e-30))
        router = aux["router_aux_loss"]
        metrics = {
            "actor/pg_loss": loss,
            "actor/entropy": -jnp.where(mask, jax.lax.stop_gradient(logp), 0.0).sum() / n_tok,
            "rollout_corr/kl": m["kl_infer"], "rollout_corr/is_mean": m["ratio_mean"],
            "rollout_corr/is_max": m["ratio_max"], "rollout_corr/frac_truncated": m["frac_truncated"],
            "rollout_corr/ess": ess,
            "canary/logp_abs_diff_mean": diff.sum() / n_tok, "canary/logp_abs_diff_max": diff.max(),
            "router_aux": jax.lax.stop_gradient(router),
            "weight": (mask.sum(axis=-1) > 0).sum().astype(jnp.float32),
        }
        if "clip_frac" in m:
            metrics["actor/clip_frac"] = m["clip_frac"]
        if "routes" in batch:
            share, rows = route_mismatch(aux["routes_own"], batch["routes"], valid)
            metrics["rollout_corr/route_mismatch"] = share
            metrics["canary/logp_abs_diff_max_same_routes"] = jnp.where(rows[:, None], 0.0, diff).max()
        return loss + aux_coef * router, metrics

    return loss_fn


def old_logprobs_fn(model_cfg: ModelConfig, *, temperature: float, chunk: int = 4096, mesh: Mesh | None = None,
                    replay: bool = False):
    """jit(params, batch) -> log π_old [B, W] (the behaviour policy of the PPO-clipped variant), no gradient; per
    batch shard of `mesh` where the train step runs per shard too (`searchjax.train.step.shards_explicitly`);
    replay=True routes as the batch's recorded routes (as `grpo_loss_fn`)."""
    inv_t = 1.0 / float(temperature)

    def fn(params, batch):
        ids = batch["input_ids"]
        valid = jnp.arange(ids.shape[1])[None, :] < batch["lengths"][:, None]
        h = hidden_states(params, ids, model_cfg, valid=valid, routes=_replayed(batch, replay))
        return jnp.where(batch["loss_mask"].astype(bool),
                         token_logprobs(h.astype(jnp.float32) * inv_t, params.unembed, batch["targets"],
                                        chunk=chunk), 0.0)

    if mesh is not None and shards_explicitly(mesh):
        return jax.jit(lambda params, batch: per_shard(fn, mesh, batch["input_ids"].shape[0], True)(params, batch))
    return jax.jit(fn)
