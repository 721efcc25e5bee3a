"""Helpers building tiny transformers Qwen3_5MoeForCausalLM models and checkpoints for parity tests (torch)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

from searchjax.model import ModelConfig, to_hf_config


def hf_model(cfg: ModelConfig, seed: int) -> Qwen3_5MoeForCausalLM:
    """An HF model of `cfg` with every parameter random (norm offsets, A_log, dt_bias included), fp32, eval."""
    torch.manual_seed(seed)
    hf_cfg = dict(to_hf_config(cfg))
    for key in ("model_type", "architectures"):
        hf_cfg.pop(key)
    model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**hf_cfg)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(0.5, 8.0)))
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15 if p.ndim >= 2 else 0.1)
    return model


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(np.array(tokens), dtype=torch.long)).logits.float().numpy()


def save_per_expert(model, path: Path) -> Path:
    """transformers' own save_pretrained (per-expert 2-D expert tensors)."""
    model.save_pretrained(path)
    return path


def save_fused(model, path: Path) -> Path:
    """The runtime state dict: fused experts gate_up_proj [E,2F,D] / down_proj [E,D,F], text prefix `model.`."""
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(model.config.to_dict()))
    return path


def save_multimodal(model, path: Path) -> Path:
    """A `qwen3_5_moe` (ForConditionalGeneration-style) checkpoint: nested text_config, `model.language_model.`
    prefix, fused experts, extra model.visual.* and mtp.* tensors, sharded over two files with an index."""
    path.mkdir(parents=True, exist_ok=True)
    state = {}
    for k, v in model.state_dict().items():
        name = k if k.startswith("lm_head") else "model.language_model." + k[len("model."):]
        state[name] = v.detach().contiguous().clone()
    state["model.visual.patch_embed.proj.weight"] = torch.randn(8, 3, 2, 4, 4)
    state["mtp.fc.weight"] = torch.randn(cfg_hidden(model), 2 * cfg_hidden(model))
    state["mtp.layers.0.mlp.gate.weight"] = torch.randn(3, cfg_hidden(model))
    names = sorted(state)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, part in enumerate(halves):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({k: state[k] for k in part}, str(path / fname))
        weight_map.update({k: fname for k in part})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    text = model.config.to_dict()
    config = {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
              "text_config": text, "vision_config": {"depth": 1}, "tie_word_embeddings": text["tie_word_embeddings"]}
    (path / "config.json").write_text(json.dumps(config))
    return path


def cfg_hidden(model) -> int:
    return model.config.hidden_size
