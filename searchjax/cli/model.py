"""`searchjax model init|info`: a random HF-format checkpoint of a preset, and what a checkpoint holds."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from searchjax.cli.common import CLIError, add_overwrite, check_input_file, check_output, positive_int, run_command


def _tokenizer_vocab(path: Path) -> int:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path)).get_vocab_size()
    except Exception as e:  # noqa: BLE001 - tokenizers raises a plain Exception for unreadable files
        raise CLIError(f"--tokenizer {path}: cannot read tokenizer: {e}") from None


@run_command
def _init(args: argparse.Namespace) -> int:
    from searchjax.atomic import atomic_path
    from searchjax.model import load_preset

    out = check_output(args.out, args.overwrite, kind="dir")
    vocab = _tokenizer_vocab(check_input_file(args.tokenizer, "--tokenizer")) if args.tokenizer else args.vocab_size
    cfg = load_preset(args.preset).replace(vocab_size=vocab)

    import jax

    from searchjax.model import init_params, param_count, save_hf

    params = init_params(cfg, jax.random.key(args.seed), args.dtype)
    with atomic_path(out) as tmp:  # --overwrite replaces the directory whole: no stale tokenizer.json survives
        save_hf(tmp, params, cfg)
        if args.tokenizer:
            shutil.copyfile(args.tokenizer, tmp / "tokenizer.json")
    print(f"wrote {args.preset} (vocab {cfg.vocab_size}, {param_count(cfg):,} parameters, {args.dtype}) to {out}")
    return 0


def describe(path: str | Path) -> dict:
    """Config, parameter counts, cache sizes and safetensors files of a checkpoint directory (reads config.json
    and the safetensors headers, so a truncated or corrupt file is reported by name)."""
    from searchjax.config import to_dict
    from searchjax.model import cache_bytes, param_count, read_hf_config
    from searchjax.model.hf import checkpoint_files

    cfg = read_hf_config(path)
    files = checkpoint_files(path)
    per_token, fixed = cache_bytes(cfg, "bfloat16")
    per_token32, fixed32 = cache_bytes(cfg, "float32")
    return {
        "config": to_dict(cfg),
        "safetensors_files": files,
        "params_total": param_count(cfg),
        "params_active": param_count(cfg, active=True),
        "cache_bytes_per_token": {"bfloat16": per_token, "float32": per_token32},
        "fixed_state_bytes_per_sequence": {"bfloat16": fixed, "float32": fixed32},
    }


@run_command
def _info(args: argparse.Namespace) -> int:
    info = describe(args.dir)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    cfg = info["config"]
    full = sum(t == "full_attention" for t in cfg["layer_types"])
    print(f"{args.dir}: {cfg['num_hidden_layers']} layers ({cfg['num_hidden_layers'] - full} Gated DeltaNet + "
          f"{full} full attention), hidden {cfg['hidden_size']}, vocab {cfg['vocab_size']}, "
          f"{cfg['num_experts']} experts top-{cfg['num_experts_per_tok']}")
    print(f"parameters: {info['params_total']:,} total, {info['params_active']:,} active per token")
    per, fixed = info["cache_bytes_per_token"], info["fixed_state_bytes_per_sequence"]
    print(f"cache: {per['bfloat16']:,} B per token (bf16 KV), plus {fixed['bfloat16']:,} B fixed per sequence "
          "(conv + fp32 DeltaNet state)")
    files = info["safetensors_files"]
    print(f"weights: {sum(files.values()):,} tensors in {len(files)} safetensors file(s), headers checked")
    return 0


def register(subparsers) -> None:
    model = subparsers.add_parser("model", help="create or inspect Qwen3.5-MoE checkpoints (HF format)")
    sub = model.add_subparsers(dest="model_command", metavar="SUBCOMMAND")
    sub.required = True
    init = sub.add_parser("init", help="randomly initialised checkpoint of a preset, saved in HF format")
    init.add_argument("--preset", required=True,
                      help="a preset name (tiny, small, qwen3.5-35b-a3b, ...: configs/model/NAME.yaml) or a YAML path")
    init.add_argument("--seed", type=int, default=0, help="PRNG seed of the initialisation")
    vocab = init.add_mutually_exclusive_group(required=True)
    vocab.add_argument("--vocab-size", type=positive_int, help="vocabulary size")
    vocab.add_argument("--tokenizer", help="tokenizer.json: vocabulary follows it and it is copied into --out")
    init.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="parameter dtype")
    init.add_argument("--out", required=True, help="output directory (config.json, safetensors, tokenizer.json)")
    add_overwrite(init)
    init.set_defaults(func=_init)
    info = sub.add_parser("info", help="config, parameter counts and cache sizes of a checkpoint")
    info.add_argument("dir", help="checkpoint directory (config.json + safetensors)")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=_info)
