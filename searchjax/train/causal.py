"""The pieces the causal-LM stages (LM pretraining, SFT) share: the loss, the start model, eval, export, FLOPs.

Loss over a batch {input_ids, targets, loss_mask, lengths[, segments]} (RECIPE.md §1 for SFT; plain next-token
for pretraining; `segments` marks the examples of packed rows, searchjax.data.packing):

    L = − Σ_{b,t} m_{b,t} log π(targets_{b,t} | input_ids_{b,≤t}) / Σ m  +  c_aux · L_aux

with m the loss mask (assistant tokens for SFT, every token for pretraining), log π from the chunked log-softmax
(never [B, T, V] logits) and L_aux the router load-balancing loss (searchjax.model.moe) weighted by
`router_aux_loss_coef` (the model config's value unless the stage config sets one), its statistics over the
real tokens only (positions < lengths).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from searchjax.chat import Tokenizer, load_tokenizer
from searchjax.losses.sft import sft_loss
from searchjax.model import ModelConfig, abstract_params, load_hf, param_shardings, read_hf_config, save_hf
from searchjax.model.hf import CheckpointError
from searchjax.model.transformer import hidden_states
from searchjax.train.flops import model_flops
from searchjax.train.step import device_batch, eval_fn

BATCH_KEYS = ("input_ids", "targets", "loss_mask", "lengths")


@dataclasses.dataclass(frozen=True)
class StartModel:
    """The checkpoint a stage starts from: its config and tokenizer, the abstract params with their shardings,
    and `load()` reading the weights straight into those shardings (only called for a fresh run)."""

    path: Path
    cfg: ModelConfig
    tokenizer: Tokenizer
    abstract: Any
    shardings: Any
    load: Callable[[], Any]


def start_model(model_dir: str | Path, mesh: Mesh, dtype: str = "float32") -> StartModel:
    """Read config.json and tokenizer.json of an HF-format checkpoint directory (errors name the file)."""
    path = Path(model_dir)
    if not path.is_dir():
        raise CheckpointError(f"--model {path}: no such checkpoint directory")
    cfg = read_hf_config(path)
    tok_path = path / "tokenizer.json"
    if not tok_path.exists():
        raise CheckpointError(f"--model {path}: no tokenizer.json beside config.json (searchjax model init "
                              "--tokenizer FILE writes one)")
    tokenizer = load_tokenizer(tok_path)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise CheckpointError(f"{tok_path}: {tokenizer.vocab_size} token ids but the model's vocab_size is "
                              f"{cfg.vocab_size}")
    return StartModel(path, cfg, tokenizer, abstract_params(cfg, dtype, mesh), param_shardings(cfg, mesh),
                      lambda: load_hf(path, dtype=dtype, mesh=mesh)[1])


def next_token_loss(model_cfg: ModelConfig, *, remat: bool, chunk: int, aux_coef: float):
    """loss_fn(params, batch, key) of the module docstring (metrics: nll, ppl, n_tokens, weight, router_aux)."""

    def loss_fn(params, batch, key):
        del key  # deterministic forward
        t = batch["input_ids"].shape[1]
        valid = jnp.arange(t)[None, :] < batch["lengths"][:, None]  # padding stays out of the router statistics
        h, aux = hidden_states(params, batch["input_ids"], model_cfg, remat=remat, return_aux=True, valid=valid,
                               segments=batch.get("segments"))
        nll, m = sft_loss(h, params.unembed, batch["targets"], batch["loss_mask"], chunk=chunk)
        loss = nll + aux_coef * aux["router_aux_loss"]
        return loss, {"nll": m["nll"], "n_tokens": m["n_tokens"], "weight": m["n_tokens"],
                      "router_aux": jax.lax.stop_gradient(aux["router_aux_loss"])}

    return loss_fn


def flops_of(model_cfg: ModelConfig) -> Callable[[dict[str, float]], float]:
    """Useful training FLOPs of one step from its counts (the batch shape as computed, padding included)."""
    return lambda c: model_flops(model_cfg, int(c["data/rows"]), int(c["data/width"]), backward=True)


def make_evaluator(loss_fn, batches: Callable[[], Iterable[dict[str, Any]]], mesh: Mesh, prefix: str = "dev"):
    """evaluate(state) -> {prefix/loss, prefix/nll, prefix/ppl, prefix/tokens}: the token-weighted mean loss over
    the batches `batches()` yields (a fresh, deterministic pass each time); {} with a warning when they hold no
    trained token."""
    def sums(params, batch):  # Σ w·loss, Σ w·nll, Σ w over the batch (its token-mean loss times its tokens)
        loss, m = loss_fn(params, batch, None)
        return loss * m["weight"], m["nll"] * m["weight"], m["weight"]

    jitted = eval_fn(sums, mesh, combine="sum")
    warned: list[bool] = []

    def evaluate(state) -> dict[str, float]:
        num = den = nll_num = 0.0
        for batch in batches():
            loss_w, nll_w, w = jitted(state.params, device_batch({k: batch[k] for k in BATCH_KEYS}, mesh))
            num, nll_num, den = num + float(loss_w), nll_num + float(nll_w), den + float(w)
        if den == 0:  # e.g. max_len cut every dev example before its assistant turns: nothing to report
            if not warned:
                warned.append(True)
                print(f"warning: {prefix} evaluation skipped: its batches hold no trained tokens (is max_len too "
                      "short for the dev examples?)", flush=True)
            return {}
        return {f"{prefix}/loss": num / den, f"{prefix}/nll": nll_num / den,
                f"{prefix}/ppl": float(np.exp(nll_num / den)), f"{prefix}/tokens": den}

    return evaluate


def hf_export(model_cfg: ModelConfig, tokenizer_path: Path):
    """export(params, directory): config.json + safetensors (save_hf) and the tokenizer.json beside them."""

    def export(params, directory: Path) -> None:
        save_hf(directory, params, model_cfg)
        shutil.copyfile(tokenizer_path, directory / "tokenizer.json")

    return export


def checkpoint_params(run_dir: str | Path, step: int | None = None) -> tuple[StartModel, Any, int]:
    """The params of a causal-LM run's checkpoint (`step`, default the newest) on the host, with the model the
    run started from (its config, tokenizer and directory) and the step restored. A step that was not saved is
    refused with the saved ones listed."""
    import json

    import yaml

    from searchjax.train.checkpoint import Checkpointer
    from searchjax.train.config import TrainConfig, load_train_config
    from searchjax.train.optim import make_optimizer
    from searchjax.train.rundir import RunDir
    from searchjax.train.runner import host_params, run_mesh
    from searchjax.train.stages import STAGES
    from searchjax.train.state import abstract_state

    run = RunDir(Path(run_dir), resuming=True)
    stage = yaml.safe_load((run.root / "run.json").read_text())["stage"] if (run.root / "run.json").exists() \
        else None
    if stage not in ("lm", "sft", "grpo"):
        raise CheckpointError(f"{run.root}: not an lm, sft or grpo run directory (run.json stage {stage!r})")
    cfg: TrainConfig = load_train_config(STAGES[stage].load().Config, run.config)
    ck = Checkpointer(run.checkpoints, cfg.checkpoint)
    steps = ck.steps()
    if not steps or (step is not None and step not in steps):
        ck.close()
        raise CheckpointError(f"{run.checkpoints}: no checkpoint {'at step ' + str(step) if step else ''} "
                              f"(saved steps: {steps})")
    step = steps[-1] if step is None else step
    meta = json.loads((run.checkpoints / str(step) / "meta" / "metadata").read_text())
    mesh = run_mesh(cfg)
    start = start_model(meta["model"], mesh)
    tx = make_optimizer(cfg.optim, cfg.steps)
    state = ck.restore_state(step, abstract_state(tx, start.abstract, start.shardings, mesh))
    ck.close()
    return start, host_params(state.params), step


def export_checkpoint(run_dir: str | Path, out: str | Path, step: int | None = None) -> int:
    """Write the params of a causal-LM run's checkpoint (`step`, default the newest) as an HF checkpoint at `out`
    (atomically; with the starting model's tokenizer.json), to evaluate or continue from an intermediate step.
    Returns the step exported."""
    from searchjax.atomic import atomic_path

    start, params, step = checkpoint_params(run_dir, step)
    if jax.process_index() == 0:
        with atomic_path(out) as tmp:
            tmp.mkdir()
            hf_export(start.cfg, start.path / "tokenizer.json")(params, tmp)
    return step
