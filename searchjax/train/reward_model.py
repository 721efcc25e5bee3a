"""Stage 2 of the recipe, the Bradley–Terry reward model (RECIPE.md §4): the symmetric loss over both orders.

    L_sym = ½ ℓ_BT(Δ(x, a, b), r) + ½ ℓ_BT(Δ(x, b, a), 1 − r)  +  c_aux · L_aux,
    ℓ_BT(Δ, r) = −[r log σ(Δ) + (1 − r) log(1 − σ(Δ))]

averaged over the pairs of a batch (`bt_loss`), with Δ from the configured scorer (searchjax.rewards.reward_model:
pointwise s(x, a) − s(x, b), or the pairwise head over x‖A‖a‖B‖b‖E) and L_aux the router load-balancing loss.
Each pair's two rows (x‖a and x‖b, or the two orders of the template) sit side by side in one batch
[B pairs, 2 rows, W tokens], so both orders come from one forward; a = chosen, b = rejected, r = 1 (L_sym is the
same with the pair swapped and r flipped).

Data: preference JSONL in TRL's shapes (`searchjax data preferences`, or a user's own file; searchjax.data.
preferences.read_preferences), rows of `data.train_split` for training and the "dev" rows (or `--dev` files) for
evaluation; pairs are shuffled per epoch (grain, checkpointable), sorted by length within windows of
`window_batches` batches and padded to the smallest of `data.buckets` (one compile per bucket).

`likelihood`: the score adds β · the response's log-likelihood under the backbone's own LM head (for the pairwise
scorer, of the response in slot A; searchjax.rewards.reward_model, module docstring), β learnt from zero; batches
then carry the assistant-token mask of each row (`mask` [B, 2, W], `Scorer.mask_rows`).

`freeze_backbone_steps`: the backbone gets no gradient for the first steps (only the value head learns, from its
zero start). The shared optimizer's trainable mask is fixed for a whole run, so the freeze is a stop-gradient
chosen by the batch's own index (its step: restored with the data iterator, so a resumed run freezes the same
steps); its Adam moments stay zero meanwhile, and AdamW's decoupled weight decay still applies to it when
`optim.weight_decay` > 0.

Metrics (train steps and dev): rm/loss (L_sym), rm/accuracy (P̄ > ½ agrees with r), rm/margin (mean of
Δ̄ · (2r − 1), the order-averaged logit towards the label), rm/position_bias (mean |P(a, b) − (1 − P(b, a))| with
P = σ(Δ) before averaging; 0 for the pointwise scorer); dev/accuracy/<category> per category. RUN/final holds the
reward model in HF format (save_reward_model) with tokenizer.json.
"""

from __future__ import annotations

import bisect
import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import grain
import jax
import jax.numpy as jnp
import numpy as np

from searchjax.data.jsonl import DataError
from searchjax.data.pipeline import EpochShuffle
from searchjax.data.preferences import encode_prompt_response, read_preferences
from searchjax.rewards.bradley_terry import bt_loss
from searchjax.rewards.reward_model import (
    CONFIG_KEY,
    PairTemplate,
    Scorer,
    abstract_reward_params,
    averaged_preference,
    from_policy,
    load_reward_model,
    make_scorer,
    read_scorer,
    reward_param_shardings,
    save_reward_model,
)
from searchjax.train.causal import start_model
from searchjax.train.config import TrainConfig
from searchjax.train.flops import model_flops
from searchjax.train.rundir import prepare_run_dir
from searchjax.train.runner import Supervised, host_prepare, run_mesh, run_supervised
from searchjax.train.step import device_batch, eval_fn

BATCH_KEYS = ("tokens", "lengths", "label", "freeze")
MASK_KEY = "mask"  # [B, 2, W] assistant-token mask of each row, in batches of a scorer with the likelihood term


@dataclasses.dataclass(frozen=True)
class RMData:
    """Preference sources (`--data` / `--dev` replace them) and batching.

    buckets: padded row lengths; a pair whose longer row exceeds the largest is an error naming it, before the
    model loads (overflow "error"), or left out and counted (overflow "drop"); window_batches: batches sorted by
    length together; eval_pairs: dev pairs per evaluation (0: all).
    train_split: only rows whose `split` is this train (null: every row); without dev files the "dev" rows of
    the training files are the dev set.
    """

    sources: tuple[str, ...] = ()
    dev: tuple[str, ...] = ()
    buckets: tuple[int, ...] = (256, 512, 1024, 2048)
    window_batches: int = 8
    eval_pairs: int = 0
    on_error: Literal["raise", "skip"] = "raise"
    overflow: Literal["error", "drop"] = "error"
    train_split: str | None = "train"

    def __post_init__(self):
        if not self.buckets or min(self.buckets) < 8 or self.window_batches < 1 or self.eval_pairs < 0:
            raise TypeError(f"data: buckets >= 8, window_batches >= 1, eval_pairs >= 0 required, got "
                            f"{list(self.buckets)}, {self.window_batches}, {self.eval_pairs}")


@dataclasses.dataclass(frozen=True)
class RMConfig(TrainConfig):
    """Reward-model stage config (configs/train/rm_*.yaml): the shared TrainConfig plus data, scorer and freeze.
    `batch_size` counts pairs (each pair is two rows)."""

    data: RMData = RMData()
    scorer: Literal["pointwise", "pairwise"] = "pointwise"
    likelihood: bool = False
    freeze_backbone_steps: int = 0
    router_aux_loss_coef: float | None = None

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.freeze_backbone_steps <= self.steps:
            raise TypeError(f"freeze_backbone_steps must be in [0, steps={self.steps}], got "
                            f"{self.freeze_backbone_steps}")


def with_files(cfg: RMConfig, data: list[str] | None, dev: list[str] | None) -> RMConfig:
    """The config with `--data` / `--dev` files as its sources, when given."""
    d = cfg.data
    if data:
        d = dataclasses.replace(d, sources=tuple(str(p) for p in data))
    if dev:
        d = dataclasses.replace(d, dev=tuple(str(p) for p in dev))
    if not d.sources:
        raise DataError("rm: no training data: pass --data FILE or set data.sources in the config")
    return dataclasses.replace(cfg, data=d)


# ------------------------------------------------------------------------------------------------------- loss
def pair_metrics(d_ab: jax.Array, d_ba: jax.Array, label: jax.Array) -> dict[str, jax.Array]:
    """rm/loss, rm/accuracy, rm/margin, rm/position_bias of (Δ(x, a, b), Δ(x, b, a), r) [B] (module docstring)."""
    sign = 2.0 * label - 1.0
    p_bar = averaged_preference(d_ab, d_ba)
    bias = jnp.abs(jax.nn.sigmoid(d_ab) - (1.0 - jax.nn.sigmoid(d_ba)))
    return {"rm/loss": bt_loss(d_ab, d_ba, label), "rm/accuracy": jnp.mean((p_bar > 0.5) == (label > 0.5)),
            "rm/margin": jnp.mean(0.5 * (d_ab - d_ba) * sign), "rm/position_bias": jnp.mean(bias)}


def pair_deltas(params, scorer: Scorer, tokens: jax.Array, lengths: jax.Array, mask: jax.Array | None = None, *,
                remat: bool = False):
    """((Δ(x, a, b), Δ(x, b, a)) [B], router aux loss) of a batch of pairs: tokens [B, 2, W], lengths [B, 2],
    mask [B, 2, W] (the assistant tokens; needed by the likelihood term only)."""
    b, _, w = tokens.shape
    rows = lambda x: jnp.swapaxes(x, 0, 1).reshape(2 * b, *x.shape[2:])  # noqa: E731  [B, 2, ...] -> firsts, seconds
    d, aux = scorer.row_deltas(params, rows(tokens), rows(lengths), None if mask is None else rows(mask),
                               remat=remat, return_aux=True)
    return d, aux["router_aux_loss"]


@jax.custom_vjp
def gradient_gate(tree: Any, keep: jax.Array) -> Any:
    """The identity on `tree` whose gradient is multiplied by `keep` (a float scalar, 0 or 1): the backbone freeze,
    without the parameter-sized copy a `where(frozen, stop_gradient(p), p)` makes in the forward."""
    return tree


def _gate_fwd(tree, keep):
    return tree, keep


def _gate_bwd(keep, g):
    return jax.tree.map(lambda x: x * keep.astype(x.dtype), g), jnp.zeros_like(keep)


gradient_gate.defvjp(_gate_fwd, _gate_bwd)


def symmetric_loss(scorer: Scorer, *, remat: bool, aux_coef: float):
    """loss_fn(params, batch, key) -> (L_sym + c_aux · L_aux, metrics) for searchjax.train.step; `weight` is the
    number of pairs (micro-batches average over pairs). batch: tokens [B, 2, W], lengths [B, 2], label [B],
    freeze [B] (the backbone gets no gradient where set)."""

    def loss_fn(params, batch, key):
        del key  # deterministic forward
        keep = 1.0 - jnp.any(batch["freeze"]).astype(jnp.float32)
        params = params.replace(backbone=gradient_gate(params.backbone, keep))
        (d_ab, d_ba), aux = pair_deltas(params, scorer, batch["tokens"], batch["lengths"], batch.get(MASK_KEY),
                                        remat=remat)
        metrics = pair_metrics(d_ab, d_ba, batch["label"])
        loss = metrics["rm/loss"] + aux_coef * aux
        return loss, {**metrics, "router_aux": jax.lax.stop_gradient(aux), "weight": jnp.float32(d_ab.shape[0])}

    return loss_fn


# ------------------------------------------------------------------------------------------------------- data
def encode_pairs(records: Sequence[dict[str, Any]], scorer: Scorer, encode, max_len: int,
                 overflow: str = "error") -> tuple[list[dict[str, Any]], int]:
    """(encoded pairs, how many were dropped): each record's two rows (scorer.rows of x, a = chosen,
    b = rejected) as id arrays, with r = 1 and its category (and, for a scorer with the likelihood term, each
    row's assistant-token mask). A row longer than `max_len` (the largest bucket) is a DataError naming the pair,
    or with overflow="drop" leaves the pair out."""
    marks = scorer.template
    out, dropped = [], 0
    for r in records:
        x, (a, b), *masks = encode_prompt_response(encode, r["prompt"], [r["chosen"], r["rejected"]],
                                                   masks=scorer.likelihood)
        rows = [np.asarray([i for piece in row for i in piece], np.int32) for row in scorer.rows(x, a, b, marks)]
        longest = max(len(row) for row in rows)
        if longest > max_len and overflow == "drop":
            dropped += 1
            continue
        if longest > max_len:
            raise DataError(f"rm: pair {r['id']!r} has a row of {longest} tokens, more than the largest bucket "
                            f"{max_len}; raise data.buckets, or set data.overflow: drop")
        pair = {"rows": rows, "label": 1.0, "category": r["category"], "id": r["id"]}
        if scorer.likelihood:
            pair["masks"] = [np.asarray(row, np.int32) for row in scorer.mask_rows(len(x), *masks[0])]
        out.append(pair)
    return out, dropped


def pad_pairs(pairs: Sequence[dict[str, Any]], width: int, pad_id: int) -> dict[str, np.ndarray]:
    """tokens [B, 2, width] (right-padded with pad_id), lengths [B, 2], label [B] of encoded pairs, and mask
    [B, 2, width] (zero-padded) when they carry masks."""
    tokens = np.full((len(pairs), 2, width), pad_id, np.int32)
    lengths = np.zeros((len(pairs), 2), np.int32)
    masked = bool(pairs) and "masks" in pairs[0]
    mask = np.zeros((len(pairs), 2, width), np.int32)
    for i, p in enumerate(pairs):
        for j, row in enumerate(p["rows"]):
            tokens[i, j, : len(row)], lengths[i, j] = row, len(row)
            if masked:
                mask[i, j, : len(row)] = p["masks"][j]
    out = {"tokens": tokens, "lengths": lengths, "label": np.array([p["label"] for p in pairs], np.float32)}
    return {**out, MASK_KEY: mask} if masked else out


class PairBatches(grain.MapDataset):
    """Batch k = batch (k mod W) of window k div W of an infinite, epoch-shuffled pair stream: the window's W·B
    pairs sorted by length, cut into W batches, each padded to the smallest bucket holding its longest row, the W
    emitted in a seeded order. freeze[k] = k < freeze_steps (k is the optimizer step the batch feeds).

    A batch is rebuilt from its window on every read (sorting W·B lengths and padding B pairs costs far less than
    a step), so the dataset holds no state beyond its parent's and any index can be read in any order.
    """

    def __init__(self, parent: grain.MapDataset, batch_pairs: int, window_batches: int, buckets: Sequence[int],
                 pad_id: int, seed: int, freeze_steps: int):
        super().__init__(parent)
        self.b, self.w, self.pad_id, self.seed = batch_pairs, window_batches, pad_id, seed
        self.freeze_steps = freeze_steps
        self.buckets = sorted(int(x) for x in buckets)

    def __len__(self) -> int:
        return len(self._parent) // (self.b * self.w) * self.w

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        w, j = divmod(index, self.w)
        n = self.b * self.w
        pairs = [self._parent[w * n + i] for i in range(n)]
        longest = [max(len(r) for r in p["rows"]) for p in pairs]
        order = sorted(range(n), key=lambda i: longest[i])
        part = int(np.random.default_rng([self.seed, w]).permutation(self.w)[j])
        idx = order[part * self.b: (part + 1) * self.b]
        width = self.buckets[bisect.bisect_left(self.buckets, max(longest[i] for i in idx))]
        batch = pad_pairs([pairs[i] for i in idx], width, self.pad_id)
        return {**batch, "freeze": np.full((self.b,), index < self.freeze_steps)}


def pair_counts(batch: dict[str, np.ndarray]) -> dict[str, float]:
    """Host-side counts of a batch: real tokens, rows, width, the non-padding share."""
    rows = batch["tokens"].shape[0] * 2
    width = batch["tokens"].shape[2]
    tokens = float(batch["lengths"].sum())
    return {"data/tokens": tokens, "data/rows": float(rows), "data/width": float(width),
            "data/nonpad_frac": tokens / (rows * width)}


# ---------------------------------------------------------------------------------------------------- stage
def _read(paths: Sequence[str], on_error: str) -> list[dict[str, Any]]:
    rows = []
    for p in paths:
        rows += read_preferences(p, on_error=on_error)[0]
    return rows


def split_pairs(cfg: RMConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training pairs, dev pairs) from the configured files (bad rows fail here, with file:line)."""
    d = cfg.data
    rows = _read(d.sources, d.on_error)
    train = rows if d.train_split is None else [r for r in rows if r["split"] == d.train_split]
    dev = _read(d.dev, d.on_error) if d.dev else [r for r in rows if r["split"] == "dev"]
    if len(train) < cfg.batch_size * d.window_batches:
        raise DataError(f"rm: {len(train)} training pairs (split {d.train_split!r}) in {list(d.sources)}, fewer than "
                        f"one window of batch_size × data.window_batches = {cfg.batch_size * d.window_batches}")
    return train, dev


def make_rm_evaluator(scorer: Scorer, dev: Sequence[dict[str, Any]], batch_pairs: int, buckets: Sequence[int],
                      mesh, prefix: str = "dev"):
    """evaluate(state) -> {prefix/rm/loss, prefix/rm/accuracy, prefix/rm/margin, prefix/rm/position_bias,
    prefix/accuracy/<category>, prefix/pairs}: every dev pair once (both orders, one forward), in length-sorted
    batches of `batch_pairs` (the last one padded with repeats of its first pair, which are dropped)."""
    # Replicated outputs: every process reads the whole [B] result (each passes the same dev rows).
    jitted = eval_fn(lambda p, b: pair_deltas(p, scorer, b["tokens"], b["lengths"], b.get(MASK_KEY))[0], mesh,
                     combine="rows")
    keys = ("tokens", "lengths", MASK_KEY) if scorer.likelihood else ("tokens", "lengths")
    buckets = sorted(buckets)
    order = sorted(range(len(dev)), key=lambda i: max(len(r) for r in dev[i]["rows"]))
    batches = []
    for s in range(0, len(order), batch_pairs):
        idx = order[s:s + batch_pairs]
        width = buckets[bisect.bisect_left(buckets, max(len(r) for i in idx for r in dev[i]["rows"]))]
        padded = idx + [idx[0]] * (batch_pairs - len(idx))
        batches.append((idx, pad_pairs([dev[i] for i in padded], width, scorer.pad_id)))

    def evaluate(state) -> dict[str, float]:
        d_ab = np.zeros(len(dev), np.float32)
        d_ba = np.zeros(len(dev), np.float32)
        for idx, batch in batches:
            a, b = jitted(state.params, device_batch({k: batch[k] for k in keys}, mesh))
            d_ab[idx], d_ba[idx] = np.asarray(a)[: len(idx)], np.asarray(b)[: len(idx)]
        label = np.array([p["label"] for p in dev], np.float32)
        out = {f"{prefix}/{k}": float(v) for k, v in pair_metrics(d_ab, d_ba, label).items()}
        correct = (np.asarray(averaged_preference(d_ab, d_ba)) > 0.5) == (label > 0.5)
        cats = np.array([p["category"] for p in dev])
        for c in sorted(set(cats)):
            out[f"{prefix}/accuracy/{c}"] = float(correct[cats == c].mean())
        out[f"{prefix}/pairs"] = float(len(dev))
        return out

    return evaluate


def _start(model: str | Path, kind: str, likelihood: bool, mesh):
    """(start model, model config with the tokenizer's pad id, scorer, init function) of `--model`: a policy
    checkpoint (lm_head dropped unless `likelihood`, zero head) or a reward model of the same scorer (trained on)."""
    start = start_model(model, mesh)
    if CONFIG_KEY in (start.path / "config.json").read_text(encoding="utf-8"):
        saved = read_scorer(start.path, start.cfg)
        if (saved.kind, saved.likelihood) != (kind, likelihood):
            raise DataError(f"--model {start.path}: a {saved.kind} reward model with likelihood={saved.likelihood}; "
                            f"this run's scorer is {kind} with likelihood={likelihood}")
        return start, saved.cfg, saved, lambda: load_reward_model(start.path, mesh=mesh)[0]
    cfg = start.cfg.replace(pad_token_id=start.tokenizer.special.pad)
    template = PairTemplate.from_encoder(start.tokenizer.encode) if kind == "pairwise" else None
    return start, cfg, make_scorer(kind, cfg, template, likelihood), \
        lambda: from_policy(start.load(), cfg, mesh=mesh, likelihood=likelihood)


def run_rm(cfg: RMConfig, model: str | Path, out: str | Path, overwrite: bool = False) -> dict[str, Any]:
    """Train the reward model from the HF checkpoint `model` into the run directory `out` (resuming it when it
    holds this run); returns the summary. The config's data sources must be set (see `with_files`)."""
    train_rows, dev_rows = split_pairs(cfg)
    if cfg.batch_size % jax.process_count():
        raise ValueError(f"batch_size {cfg.batch_size} is not a multiple of the {jax.process_count()} processes")
    mesh = run_mesh(cfg)
    start, model_cfg, scorer, init = _start(model, cfg.scorer, cfg.likelihood, mesh)
    max_len, overflow = max(cfg.data.buckets), cfg.data.overflow
    train, dropped = encode_pairs(train_rows, scorer, start.tokenizer.encode, max_len, overflow)
    dev, dev_dropped = encode_pairs(dev_rows, scorer, start.tokenizer.encode, max_len, overflow)
    if dropped or dev_dropped:
        print(f"rm: left out {dropped} training and {dev_dropped} dev pairs longer than {max_len} tokens "
              "(data.overflow: drop)", flush=True)
    if len(train) < cfg.batch_size * cfg.data.window_batches:
        raise DataError(f"rm: {len(train)} training pairs fit the buckets, fewer than one window of batch_size × "
                        f"data.window_batches = {cfg.batch_size * cfg.data.window_batches}")
    if cfg.data.eval_pairs:
        dev = dev[:: max(1, len(dev) // cfg.data.eval_pairs)][: cfg.data.eval_pairs]
    run = prepare_run_dir(out, "rm", cfg, overwrite)
    p, procs = jax.process_index(), jax.process_count()
    stream = EpochShuffle(grain.MapDataset.source(train)[p::procs], seed=cfg.seed)
    local = cfg.batch_size // procs
    dataset = PairBatches(stream, local, cfg.data.window_batches, cfg.data.buckets, scorer.pad_id, cfg.seed,
                          cfg.freeze_backbone_steps)
    aux = model_cfg.router_aux_loss_coef if cfg.router_aux_loss_coef is None else cfg.router_aux_loss_coef
    evaluate = make_rm_evaluator(scorer, dev, local, cfg.data.buckets, mesh) if dev else None
    tokenizer_path = start.path / "tokenizer.json"

    def export(params, directory: Path) -> None:
        save_reward_model(directory, params, scorer)
        shutil.copyfile(tokenizer_path, directory / "tokenizer.json")

    return run_supervised(Supervised(
        stage="rm", cfg=cfg, run=run, mesh=mesh,
        abstract_params=abstract_reward_params(model_cfg, mesh=mesh, likelihood=cfg.likelihood),
        param_shardings=reward_param_shardings(model_cfg, mesh, cfg.likelihood), init_params=init,
        loss_fn=symmetric_loss(scorer, remat=cfg.remat, aux_coef=aux), iterator=iter(dataset.to_iter_dataset()),
        prepare=host_prepare(mesh, BATCH_KEYS + ((MASK_KEY,) if cfg.likelihood else ()), pair_counts),
        flops=lambda c: model_flops(model_cfg, int(c["data/rows"]), int(c["data/width"]), backward=True),
        export=export, evaluate=evaluate,
        meta={"model": str(start.path), "scorer": scorer.kind, "likelihood": scorer.likelihood, "train_pairs": len(train), "dev_pairs": len(dev),
              "dropped_pairs": dropped + dev_dropped},
    ))


# The stage interface of searchjax.train.stages.
Config = RMConfig
run = run_rm
