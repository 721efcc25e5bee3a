"""ModelConfig: presets, YAML validation, HF config mapping, parameter counts."""

import jax
import pytest

from searchjax.config import ConfigError, configs_dir
from searchjax.model import (ModelConfig, abstract_params, cache_bytes, from_hf_config, load_preset, param_count,
                             to_hf_config)
from searchjax.model.config import FULL, LINEAR

PRESETS = ["tiny", "small", "qwen3.5-35b-a3b", "qwen3.5-122b-a10b", "qwen3.5-397b-a17b"]


def _count_eval_shape(cfg):
    shapes = jax.eval_shape(lambda: abstract_params(cfg, "bfloat16"))
    return sum(x.size for x in jax.tree.leaves(shapes))


def test_every_model_yaml_loads():
    files = sorted((configs_dir() / "model").glob("*.yaml"))
    assert {f.stem for f in files} >= set(PRESETS)
    for f in files:
        cfg = load_preset(str(f))
        assert isinstance(cfg, ModelConfig) and len(cfg.layer_types) == cfg.num_hidden_layers


def test_397b_has_exact_parameter_count():
    cfg = load_preset("qwen3.5-397b-a17b")
    assert _count_eval_shape(cfg) == 396_346_350_336 == param_count(cfg)
    assert cfg.num_full_layers == 15 and cfg.num_linear_layers == 45
    assert [i for i, t in enumerate(cfg.layer_types) if t == FULL] == list(range(3, 60, 4))
    # QWEN35.md §2.2: ~17.35 B active; §4: 30,720 B of KV per token (bf16).
    assert abs(param_count(cfg, active=True) / 1e9 - 17.35) < 0.01
    assert cache_bytes(cfg, "bfloat16")[0] == 30_720


def test_122b_count_and_small_sizes():
    assert abs(param_count(load_preset("qwen3.5-122b-a10b")) / 1e9 - 122.11) < 0.01
    assert param_count(load_preset("tiny")) < 1_000_000
    small = load_preset("small")
    assert 10e6 < param_count(small) < 100e6 and small.num_experts == 64 and small.num_experts_per_tok == 4


def test_unknown_yaml_key_lists_valid_keys(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text((configs_dir() / "model" / "tiny.yaml").read_text() + "hiden_size: 3\n")
    with pytest.raises(ConfigError, match=r"hiden_size.*valid keys.*hidden_size"):
        load_preset(str(f))
    with pytest.raises(ConfigError, match="unknown model preset 'nope'"):
        load_preset("nope")


@pytest.mark.parametrize("change, match", [
    (dict(num_attention_heads=3), "not a multiple of num_key_value_heads"),
    (dict(num_experts_per_tok=99), "num_experts_per_tok=99 > num_experts"),
    (dict(layer_types=(LINEAR,)), "layer_types has 1 entries"),
    (dict(layer_types=("mamba",) * 4), "unknown types"),
    (dict(hidden_size=0), "hidden_size must be > 0"),
    (dict(partial_rotary_factor=0.01), "rotary dim"),
    (dict(moe_impl="dense"), "moe_impl must be 'auto', 'block' or 'ragged'"),
    (dict(layer_loop="fori"), "layer_loop must be one of"),
])
def test_invalid_configs_are_rejected(change, match):
    with pytest.raises(ConfigError, match=match):
        load_preset("tiny").replace(**change)


def test_layer_types_from_interval():
    cfg = load_preset("tiny").replace(num_hidden_layers=8, layer_types=())
    assert cfg.layer_types == (LINEAR, LINEAR, LINEAR, FULL) * 2
    assert (cfg.num_linear_layers, cfg.num_full_layers) == (6, 2)


@pytest.mark.parametrize("name", PRESETS)
def test_hf_config_roundtrip(name):
    cfg = load_preset(name)
    hf = to_hf_config(cfg)
    assert hf["model_type"] == "qwen3_5_moe_text" and hf["rope_parameters"]["rope_theta"] == cfg.rope_theta
    assert from_hf_config(hf) == cfg
    assert not {"moe_impl", "chunk_size", "layer_loop"} & set(hf)  # compute choices, not HF fields
    nested = {"model_type": "qwen3_5_moe", "text_config": hf, "vision_config": {}}
    assert from_hf_config(nested) == cfg


def test_hf_config_real_style_keys():
    hf = to_hf_config(load_preset("qwen3.5-397b-a17b"))
    del hf["layer_types"]
    hf.update(full_attention_interval=4, attn_output_gate=True, mtp_num_hidden_layers=1, mamba_ssm_dtype="float32",
              eos_token_id=[248046, 248044], dtype="bfloat16", output_gate_type="swish")
    hf["rope_parameters"].update(mrope_section=[11, 11, 10], mrope_interleaved=True)
    cfg = from_hf_config(hf)
    assert cfg == load_preset("qwen3.5-397b-a17b").replace(eos_token_id=248046)


@pytest.mark.parametrize("change, match", [
    (dict(model_type="llama"), "unknown model_type 'llama'"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0}), "rope_type='yarn'"),
    (dict(num_experts="many"), "num_experts: expected int"),
])
def test_hf_config_errors(change, match):
    hf = to_hf_config(load_preset("tiny"))
    hf.update(change)
    with pytest.raises(ConfigError, match=match):
        from_hf_config(hf)


def test_a_config_without_deltanet_layers_initialises_and_runs(tmp_path):
    """full_attention_interval 1 (every layer full attention): the empty DeltaNet stack initialises."""
    import jax
    import jax.numpy as jnp

    from searchjax.model import forward, init_params, load_hf, load_preset, save_hf

    cfg = load_preset("tiny").replace(full_attention_interval=1, layer_types=())
    assert set(cfg.layer_types) == {"full_attention"}
    params = init_params(cfg, jax.random.key(0))
    logits = forward(params, jnp.arange(12, dtype=jnp.int32)[None] % cfg.vocab_size, cfg)
    assert logits.shape == (1, 12, cfg.vocab_size) and bool(jnp.isfinite(logits).all())
    save_hf(tmp_path / "m", params, cfg)  # and round-trips through the HF format
    cfg2, loaded = load_hf(tmp_path / "m")
    assert cfg2.layer_types == cfg.layer_types
    assert bool(jnp.array_equal(forward(loaded, jnp.arange(12, dtype=jnp.int32)[None], cfg2), logits))
