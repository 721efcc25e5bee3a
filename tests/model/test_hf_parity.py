"""Parity with transformers' Qwen3_5MoeForCausalLM (torch, CPU, fp32) in every checkpoint layout, and save_hf.

Tolerance (CONVENTIONS.md, never loosened): max|Δlogit| ≤ 1e-4 · max|logit| in fp32.
"""

import json

import jax
import numpy as np
import pytest
import torch
from tests.model.hf_reference import hf_logits, hf_model, save_fused, save_multimodal, save_per_expert
from safetensors.numpy import load_file, save_file
from transformers import Qwen3_5MoeForCausalLM

from searchjax.model import CheckpointError, forward, load_hf, save_hf
from searchjax.sharding import make_mesh
from searchjax.testing.models import random_tokens, tiny_config

RTOL = 1e-4
LAYOUTS = {"per_expert": save_per_expert, "fused": save_fused, "multimodal": save_multimodal}
CASES = [("tiny", 0), ("tiny", 1), ("alt", 2), ("tied", 3)]


def assert_close_logits(ours, ref):
    err = np.max(np.abs(np.asarray(ours) - ref))
    assert err <= RTOL * np.max(np.abs(ref)), f"max|Δlogit| = {err}, max|logit| = {np.max(np.abs(ref))}"


@pytest.fixture(scope="module", params=CASES, ids=[f"{n}-seed{s}" for n, s in CASES])
def reference(request):
    name, seed = request.param
    cfg = tiny_config(name)
    model = hf_model(cfg, seed)
    tokens = np.asarray(random_tokens(seed, 2, 70, cfg.vocab_size))  # 70 tokens: 5 DeltaNet chunks of 16, 2 of 64
    return cfg, model, tokens, hf_logits(model, tokens)


def ours(params, tokens, cfg):
    """Logits via forward(return_aux=True): one compiled function per config serves every test."""
    return forward(params, tokens, cfg, return_aux=True)[0]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_logits_match_transformers(reference, layout, tmp_path):
    cfg, model, tokens, ref = reference
    path = LAYOUTS[layout](model, tmp_path / layout)
    loaded_cfg, params = load_hf(path)
    assert loaded_cfg == cfg
    assert_close_logits(ours(params, tokens, loaded_cfg), ref)


def test_router_aux_loss_and_chunk_size(reference, tmp_path):
    """The load-balancing loss equals HF's aux_loss; a DeltaNet chunk of 64 (HF's) instead of 16 gives the same logits."""
    cfg, model, tokens, ref = reference
    _, params = load_hf(save_per_expert(model, tmp_path / "ck"))
    with torch.no_grad():
        out = model(torch.tensor(np.array(tokens), dtype=torch.long), output_router_logits=True)
    _, aux = forward(params, tokens, cfg, return_aux=True)
    np.testing.assert_allclose(float(aux["router_aux_loss"]), float(out.aux_loss), rtol=1e-5)
    assert_close_logits(ours(params, tokens, cfg.replace(chunk_size=64)), ref)


def test_save_hf_loads_in_transformers_with_same_logits(reference, tmp_path):
    cfg, model, tokens, ref = reference
    _, params = load_hf(save_fused(model, tmp_path / "src"))
    save_hf(tmp_path / "out", params, cfg)
    reloaded = Qwen3_5MoeForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert_close_logits(hf_logits(reloaded, tokens), ref)
    assert_close_logits(ours(load_hf(tmp_path / "out")[1], tokens, cfg), ref)


def test_save_hf_shards_with_index(reference, tmp_path):
    cfg, model, tokens, ref = reference
    _, params = load_hf(save_fused(model, tmp_path / "src"))
    save_hf(tmp_path / "out", params, cfg, max_shard_bytes=100_000)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert_close_logits(ours(load_hf(tmp_path / "out")[1], tokens, cfg), ref)


def test_load_into_mesh_equals_unsharded(tmp_path):
    cfg = tiny_config("tiny")
    path = save_fused(hf_model(cfg, 5), tmp_path / "ck")
    _, plain = load_hf(path)
    mesh = make_mesh({"fsdp": 2, "tensor": 2, "expert": 2})
    _, sharded = load_hf(path, mesh=mesh)
    w = sharded.linear.moe.w_gate
    assert w.sharding.spec[1] == "expert" and len(w.sharding.device_set) == 8
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(sharded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _one_tensor_changed(path, name, fn):
    tensors = load_file(str(path / "model.safetensors"))
    fn(tensors, name)
    save_file(tensors, str(path / "model.safetensors"))


def test_missing_tensor_and_shape_mismatch_are_named(tmp_path):
    cfg = tiny_config("tiny")
    path = save_fused(hf_model(cfg, 0), tmp_path / "ck")
    name = "model.layers.3.self_attn.k_proj.weight"
    _one_tensor_changed(path, name, lambda t, n: t.__setitem__(n, t[n][:-1]))
    with pytest.raises(CheckpointError, match=r"k_proj.weight' has shape \[63, 64\], expected \[64, 64\]"):
        load_hf(path)
    _one_tensor_changed(path, name, lambda t, n: t.pop(n))
    with pytest.raises(CheckpointError, match="missing tensor 'model.layers.3.self_attn.k_proj.weight'"):
        load_hf(path)
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_hf(path)
