"""Plain next-token pretraining on the world's corpus: the offline stand-in for a pretrained base model.

The write-up starts SFT from a pretrained Qwen3.5; none can be downloaded here, and a random policy has neither
the world's facts (what budget 0 measures) nor the induction behaviour that copying names from a question or a
search result needs. This stage gives it both: documents as text (`searchjax.data.lm`: one token stream cut into
rows of seq_len, no padding), the loss of `searchjax.train.causal` on every token, the run directory, metrics,
checkpoints and resume of every stage.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from searchjax.chat import QWEN35_SPECIAL_TOKENS
from searchjax.data.jsonl import DataError
from searchjax.data.lm import lm_dataset, stream_rows, token_stream
from searchjax.train.causal import BATCH_KEYS, flops_of, hf_export, make_evaluator, next_token_loss, \
    start_model
from searchjax.train.config import TrainConfig
from searchjax.train.rundir import prepare_run_dir
from searchjax.train.runner import Supervised, host_prepare, run_mesh, run_supervised


@dataclasses.dataclass(frozen=True)
class LMData:
    """Corpus files (`--data` / `--dev` replace them): corpus JSONL (title + text) or plain text lines.

    Without dev files, the last `dev_fraction` of the rows is held out for the dev loss. `copy_fraction` of the
    training rows (never the dev rows) are induction rows x ‖ x of fresh random ids (`searchjax.data.lm.CopyRows`):
    0 = plain pretraining. `copy_vocab` > 0 draws those ids from the first copy_vocab ids only (a smaller alphabet
    makes the copy easier to discover: the start of a curriculum); 0 = every id below the chat template's."""

    sources: tuple[str, ...] = ()
    dev: tuple[str, ...] = ()
    seq_len: int = 512
    dev_fraction: float = 0.02
    eval_batches: int = 4
    copy_fraction: float = 0.0
    copy_vocab: int = 0

    def __post_init__(self):
        if self.seq_len < 2 or not 0 <= self.dev_fraction < 1 or self.eval_batches < 0:
            raise TypeError(f"data: seq_len >= 2, 0 <= dev_fraction < 1, eval_batches >= 0 required, got "
                            f"{self.seq_len}, {self.dev_fraction}, {self.eval_batches}")
        if not 0 <= self.copy_fraction <= 1:
            raise TypeError(f"data.copy_fraction: expected a share in [0, 1], got {self.copy_fraction}")
        if self.copy_vocab < 0:
            raise TypeError(f"data.copy_vocab: expected 0 (every id) or a positive id count, got {self.copy_vocab}")


@dataclasses.dataclass(frozen=True)
class LMConfig(TrainConfig):
    """LM-pretraining stage config (configs/train/lm_*.yaml)."""

    data: LMData = LMData()
    loss_chunk: int = 4096
    router_aux_loss_coef: float | None = None


def copy_id_limit(tokenizer, copy_vocab: int = 0) -> int:
    """The induction rows' ids lie in [0, this): below the chat template's special tokens, and below copy_vocab
    when it is set (`LMData`)."""
    ids = [tokenizer.token_to_id(t) for t in QWEN35_SPECIAL_TOKENS]
    first_special = min(i for i in ids if i is not None)
    return min(first_special, copy_vocab) if copy_vocab else first_special


def with_files(cfg: LMConfig, data: list[str] | None, dev: list[str] | None) -> LMConfig:
    d = cfg.data
    if data:
        d = dataclasses.replace(d, sources=tuple(map(str, data)))
    if dev:
        d = dataclasses.replace(d, dev=tuple(map(str, dev)))
    if not d.sources:
        raise DataError("lm: no corpus: pass --data FILE or set data.sources in the config")
    return dataclasses.replace(cfg, data=d)


def _check_files(paths) -> None:
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise DataError(f"lm: no such corpus file(s): {missing}")


def run_lm(cfg: LMConfig, model: str | Path, out: str | Path, overwrite: bool = False) -> dict[str, Any]:
    """Pretrain the HF checkpoint `model` on the corpus into the run directory `out`; returns the summary."""
    d = cfg.data
    _check_files([*d.sources, *d.dev])
    mesh = run_mesh(cfg)
    start = start_model(model, mesh)
    rows = stream_rows(token_stream(d.sources, start.tokenizer), d.seq_len)
    if d.dev:
        dev_rows = stream_rows(token_stream(d.dev, start.tokenizer), d.seq_len)
    else:
        # At least one dev batch when the corpus has rows to spare (2% of a small world is less than a batch).
        n_dev = int(round(len(rows) * d.dev_fraction))
        if d.dev_fraction > 0 and len(rows) >= 3 * cfg.batch_size:
            n_dev = max(n_dev, cfg.batch_size)
        rows, dev_rows = (rows[: len(rows) - n_dev], rows[len(rows) - n_dev:]) if n_dev else (rows, None)
    high = copy_id_limit(start.tokenizer, d.copy_vocab) if d.copy_fraction > 0 else None
    iterator = iter(lm_dataset(rows, cfg.batch_size, cfg.seed, copy_fraction=d.copy_fraction,
                               copy_high=high).to_iter_dataset())
    run = prepare_run_dir(out, "lm", cfg, overwrite)
    aux = start.cfg.router_aux_loss_coef if cfg.router_aux_loss_coef is None else cfg.router_aux_loss_coef
    loss_fn = next_token_loss(start.cfg, remat=cfg.remat, chunk=cfg.loss_chunk, aux_coef=aux)
    evaluate = None
    if dev_rows is not None and len(dev_rows) >= cfg.batch_size and d.eval_batches > 0:
        dev = lm_dataset(dev_rows, cfg.batch_size, cfg.seed, shuffle=False)
        n = min(d.eval_batches, len(dev))
        evaluate = make_evaluator(loss_fn, lambda: (dev[i] for i in range(n)), mesh)
    elif d.eval_batches > 0:
        print(f"warning: lm: no dev loss ({0 if dev_rows is None else len(dev_rows)} dev rows, fewer than one "
              f"batch of {cfg.batch_size})", flush=True)
    return run_supervised(Supervised(
        stage="lm", cfg=cfg, run=run, mesh=mesh, abstract_params=start.abstract, param_shardings=start.shardings,
        init_params=start.load, loss_fn=loss_fn, iterator=iterator,
        prepare=host_prepare(mesh, BATCH_KEYS), flops=flops_of(start.cfg),
        export=hf_export(start.cfg, start.path / "tokenizer.json"), evaluate=evaluate,
        meta={"model": str(start.path), "train_rows": int(len(rows)), "tokens_per_epoch": int(np.prod(rows.shape))},
    ))


# The stage interface of searchjax.train.stages.
Config = LMConfig
run = run_lm
