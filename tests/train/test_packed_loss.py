"""The SFT loss of a packed batch is the token-weighted mean of its examples' losses, each computed alone."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from searchjax.chat import load_tokenizer
from searchjax.data.bucketing import pad_rows
from searchjax.data.jsonl import read_jsonl
from searchjax.data.packing import packed_dataset
from searchjax.data.pipeline import Encoder, PipelineConfig, SourceConfig
from searchjax.model import load_hf
from searchjax.train.causal import next_token_loss


def test_packed_loss_equals_the_examples_alone(workspace):
    cfg, params = load_hf(workspace["model"])
    tok = load_tokenizer(workspace["tokenizer"])
    pipe = PipelineConfig(sources=(SourceConfig("s", str(workspace["sft"]), "sft"),), seed=1, batch_size=1,
                          max_len=2048, overflow="truncate")
    enc = Encoder(tok, pipe)
    batch = next(iter(packed_dataset(pipe, enc, [read_jsonl(workspace["sft"])[0]], batch_size=1, pack_len=4096,
                                     bins=1, process_index=0, process_count=1)))
    seg = batch["segments"][0]
    assert seg.max() >= 2, "the row should hold several examples"
    loss_fn = next_token_loss(cfg, remat=False, chunk=1024, aux_coef=0.0)
    packed = loss_fn(params, {k: jnp.asarray(v) for k, v in batch.items()}, None)[1]
    num = den = 0.0
    for s in range(1, seg.max() + 1):
        at = np.flatnonzero(seg == s)
        ids = batch["input_ids"][0, at]
        alone = pad_rows([(ids, np.zeros_like(ids))], len(ids), enc.pad)
        alone["loss_mask"] = batch["loss_mask"][:, at]  # the example's own (already shifted) mask
        m = loss_fn(params, {k: jnp.asarray(v) for k, v in alone.items()}, None)[1]
        num, den = num + float(m["nll"]) * float(m["n_tokens"]), den + float(m["n_tokens"])
    assert float(packed["n_tokens"]) == den
    np.testing.assert_allclose(float(packed["nll"]), num / den, rtol=1e-5)
