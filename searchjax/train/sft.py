"""Stage 1 of the recipe, SFT warm-up (RECIPE.md §1): next-token loss on assistant tokens only.

Data: the two-part SFT mix (tool-use trajectories and preference-style examples, `searchjax data sft` records)
through Grain, length-bucketed (searchjax.data.bucketing) so a run compiles one step per bucket and pads little,
or packed several to a row (searchjax.data.packing, `data.pack_len`);
dev loss every `eval_every` steps on the dev split. Loss: `searchjax.train.causal` (assistant-token NLL + the
router load-balancing loss).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from searchjax.data.bucketing import bucketed_dataset
from searchjax.data.jsonl import DataError
from searchjax.data.packing import packed_dataset
from searchjax.data.pipeline import Encoder, PipelineConfig, SourceConfig, load_sources
from searchjax.train.causal import BATCH_KEYS, flops_of, hf_export, make_evaluator, next_token_loss, \
    start_model
from searchjax.train.config import TrainConfig
from searchjax.train.rundir import prepare_run_dir
from searchjax.train.runner import Supervised, host_prepare, run_mesh, run_supervised


@dataclasses.dataclass(frozen=True)
class SFTData:
    """SFT sources (`--data` / `--dev` replace them), bucketing and rendering.

    buckets: padded lengths a batch may take (max_len is always one); window_batches: batches sorted together
    (more = less padding, same shapes); eval_batches: dev batches per evaluation (padded to max_len: one compile).
    pack_len > 0 packs the training examples into rows of that many tokens instead (searchjax.data.packing:
    first-fit over `pack_bins` rows at a time; batch_size counts rows; one shape; buckets unused), for a far
    smaller padding share when examples are longer than half of max_len; 0 buckets them.
    train_split: only rows whose `split` is this train (null: every row), so the held-out questions that
    `data synth-qa` marks "dev" never reach training; without dev sources, the rows of the training files whose
    split is "dev" are the dev set.
    """

    sources: tuple[SourceConfig, ...] = ()
    dev: tuple[SourceConfig, ...] = ()
    max_len: int = 2048
    buckets: tuple[int, ...] = (512, 1024, 2048)
    window_batches: int = 16
    pack_len: int = 0
    pack_bins: int = 16
    eval_batches: int = 4
    tool_budget: int = 5
    enable_thinking: bool = True
    on_error: Literal["raise", "skip"] = "raise"
    overflow: Literal["error", "truncate"] = "truncate"
    train_split: str | None = "train"

    def __post_init__(self):
        if self.window_batches < 1 or self.eval_batches < 0 or self.max_len < 8:
            raise TypeError(f"data: window_batches >= 1, eval_batches >= 0, max_len >= 8 required, got "
                            f"{self.window_batches}, {self.eval_batches}, {self.max_len}")
        if any(b < 1 or b > self.max_len for b in self.buckets):
            raise TypeError(f"data.buckets {list(self.buckets)} must lie in [1, max_len={self.max_len}]")
        if self.pack_len and self.pack_len < self.max_len or self.pack_len < 0 or self.pack_bins < 1:
            raise TypeError(f"data.pack_len: 0 (bucketing) or >= max_len={self.max_len}, got {self.pack_len}; "
                            f"data.pack_bins >= 1, got {self.pack_bins}")


@dataclasses.dataclass(frozen=True)
class SFTConfig(TrainConfig):
    """SFT stage config (configs/train/sft_*.yaml): the shared TrainConfig plus data and loss settings."""

    data: SFTData = SFTData()
    loss_chunk: int = 4096
    router_aux_loss_coef: float | None = None


def with_files(cfg: SFTConfig, data: list[str] | None, dev: list[str] | None) -> SFTConfig:
    """The config with `--data` / `--dev` files as its sources (equal weights), when given."""
    def sources(paths, name):
        return tuple(SourceConfig(name=f"{name}{i}", path=str(p), kind="sft") for i, p in enumerate(paths))

    d = cfg.data
    if data:
        d = dataclasses.replace(d, sources=sources(data, "data"))
    if dev:
        d = dataclasses.replace(d, dev=sources(dev, "dev"))
    if not d.sources:
        raise DataError("sft: no training data: pass --data FILE or set data.sources in the config")
    return dataclasses.replace(cfg, data=d)


def split_records(cfg: SFTConfig, records: list[list[dict]]) -> tuple[list[list[dict]], list[list[dict]] | None]:
    """(training rows, dev rows or None) of each source by `data.train_split` (see SFTData)."""
    split = cfg.data.train_split
    if split is None:
        return records, None
    train = [[r for r in rows if r.get("split", split) == split] for rows in records]
    dev = [[r for r in rows if r.get("split") == "dev"] for rows in records]
    empty = [s.path for s, rows in zip(cfg.data.sources, train) if not rows]
    if empty:
        raise DataError(f"sft: no rows with split {split!r} in {empty} (set data.train_split: null to use every row)")
    return train, (dev if all(dev) else None)


def _pipeline(cfg: SFTConfig, sources) -> PipelineConfig:
    d = cfg.data
    return PipelineConfig(sources=sources, seed=cfg.seed, batch_size=cfg.batch_size, max_len=d.max_len,
                          tool_budget=d.tool_budget, enable_thinking=d.enable_thinking, on_error=d.on_error,
                          overflow=d.overflow)


def train_batches(cfg: SFTConfig, encoder: Encoder, records: list[list[dict]], batch_size: int | None = None):
    """(iterator over this process's training batches, the array keys the step takes): packed rows when
    `data.pack_len` is set, else length buckets; `batch_size` defaults to the config's."""
    d, b = cfg.data, batch_size or cfg.batch_size
    pipe = encoder.cfg
    if d.pack_len:
        return iter(packed_dataset(pipe, encoder, records, batch_size=b, pack_len=d.pack_len, bins=d.pack_bins)), \
            BATCH_KEYS + ("segments",)
    return iter(bucketed_dataset(pipe, encoder, records, batch_size=b, window_batches=d.window_batches,
                                 buckets=d.buckets).to_iter_dataset()), BATCH_KEYS


def run_sft(cfg: SFTConfig, model: str | Path, out: str | Path, overwrite: bool = False) -> dict[str, Any]:
    """Train SFT from the HF checkpoint `model` into the run directory `out` (resuming it when it holds this
    run); returns the summary. The config's data sources must be set (see `with_files`)."""
    train_pipe = _pipeline(cfg, cfg.data.sources)
    records, dev_records = split_records(cfg, load_sources(train_pipe)[0])  # bad rows fail here, with file:line
    if cfg.data.dev:
        dev_records = load_sources(_pipeline(cfg, cfg.data.dev))[0]
    mesh = run_mesh(cfg)
    start = start_model(model, mesh)
    run = prepare_run_dir(out, "sft", cfg, overwrite)
    iterator, keys = train_batches(cfg, Encoder(start.tokenizer, train_pipe), records)
    aux = start.cfg.router_aux_loss_coef if cfg.router_aux_loss_coef is None else cfg.router_aux_loss_coef
    loss_fn = next_token_loss(start.cfg, remat=cfg.remat, chunk=cfg.loss_chunk, aux_coef=aux)
    evaluate = None
    if dev_records is not None and cfg.data.eval_batches > 0:
        dev_pipe = _pipeline(cfg, cfg.data.dev or cfg.data.sources)

        def dev_batches():
            ds = bucketed_dataset(dev_pipe, Encoder(start.tokenizer, dev_pipe), dev_records, batch_size=cfg.batch_size,
                                  window_batches=1, buckets=(cfg.data.max_len,))
            return (ds[i] for i in range(cfg.data.eval_batches))

        evaluate = make_evaluator(loss_fn, dev_batches, mesh)
    return run_supervised(Supervised(
        stage="sft", cfg=cfg, run=run, mesh=mesh, abstract_params=start.abstract, param_shardings=start.shardings,
        init_params=start.load, loss_fn=loss_fn, iterator=iterator,
        prepare=host_prepare(mesh, keys), flops=flops_of(start.cfg),
        export=hf_export(start.cfg, start.path / "tokenizer.json"), evaluate=evaluate,
        meta={"model": str(start.path)},
    ))


# The stage interface of searchjax.train.stages.
Config = SFTConfig
run = run_sft
