"""The Qwen3.5 MoE text model in pure JAX: config, params, forward, decode cache, HF checkpoints.

    from searchjax.model import ModelConfig, load_preset, init_params, forward, hidden_states, init_cache, \
        prefill, decode_step, insert_cache, load_hf, save_hf, param_count

`params.unembed` is the [V, D] unembedding matrix (logits = hidden_states(...) @ params.unembed.T, as `unembed`).
"""

from searchjax.model.cache import Cache, cache_bytes, cache_shapes, cache_shardings, init_cache, insert_cache
from searchjax.model.config import ModelConfig, from_hf_config, load_preset, preset_names, to_hf_config
from searchjax.model.hf import CheckpointError, load_hf, read_hf_config, save_hf
from searchjax.model.params import Params, abstract_params, init_params, param_count, param_shardings, param_specs
from searchjax.model.transformer import decode_step, forward, hidden_states, prefill, unembed

__all__ = [
    "Cache",
    "CheckpointError",
    "ModelConfig",
    "Params",
    "abstract_params",
    "cache_bytes",
    "cache_shapes",
    "cache_shardings",
    "decode_step",
    "forward",
    "from_hf_config",
    "hidden_states",
    "init_cache",
    "init_params",
    "insert_cache",
    "load_hf",
    "load_preset",
    "param_count",
    "param_shardings",
    "param_specs",
    "prefill",
    "read_hf_config",
    "save_hf",
    "preset_names",
    "to_hf_config",
    "unembed",
]
