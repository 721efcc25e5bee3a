"""`searchjax model init|info`: a random HF-format checkpoint of a preset, and what a checkpoint holds."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path


def _init(args: argparse.Namespace) -> int:
    import jax
    from tokenizers import Tokenizer

    from searchjax.config import ConfigError
    from searchjax.model import init_params, load_preset, param_count, save_hf

    vocab = args.vocab_size
    if args.tokenizer:
        try:
            vocab = Tokenizer.from_file(str(args.tokenizer)).get_vocab_size()
        except Exception as e:  # noqa: BLE001 - tokenizers raises a plain Exception for unreadable files
            print(f"error: {args.tokenizer}: cannot read tokenizer: {e}", file=sys.stderr)
            return 1
    try:
        cfg = load_preset(args.preset).replace(vocab_size=vocab)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    params = init_params(cfg, jax.random.key(args.seed), args.dtype)
    save_hf(args.out, params, cfg)
    if args.tokenizer:
        shutil.copyfile(args.tokenizer, Path(args.out) / "tokenizer.json")
    print(f"wrote {args.preset} (vocab {cfg.vocab_size}, {param_count(cfg):,} parameters, {args.dtype}) to {args.out}")
    return 0


def describe(path: str | Path) -> dict:
    """Config, parameter counts and cache sizes of a checkpoint directory (reads config.json only)."""
    from searchjax.config import to_dict
    from searchjax.model import cache_bytes, param_count, read_hf_config

    cfg = read_hf_config(path)
    per_token, fixed = cache_bytes(cfg, "bfloat16")
    per_token32, fixed32 = cache_bytes(cfg, "float32")
    return {
        "config": to_dict(cfg),
        "params_total": param_count(cfg),
        "params_active": param_count(cfg, active=True),
        "cache_bytes_per_token": {"bfloat16": per_token, "float32": per_token32},
        "fixed_state_bytes_per_sequence": {"bfloat16": fixed, "float32": fixed32},
    }


def _info(args: argparse.Namespace) -> int:
    from searchjax.config import ConfigError
    from searchjax.model import CheckpointError

    try:
        info = describe(args.dir)
    except (ConfigError, CheckpointError, OSError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
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
    return 0


def register(subparsers) -> None:
    model = subparsers.add_parser("model", help="create or inspect Qwen3.5-MoE checkpoints (HF format)")
    sub = model.add_subparsers(dest="model_command", metavar="SUBCOMMAND")
    sub.required = True
    init = sub.add_parser("init", help="randomly initialised checkpoint of a preset, saved in HF format")
    init.add_argument("--preset", required=True, help="configs/model/<NAME>.yaml or a YAML path")
    init.add_argument("--seed", type=int, default=0)
    vocab = init.add_mutually_exclusive_group(required=True)
    vocab.add_argument("--vocab-size", type=int, help="vocabulary size")
    vocab.add_argument("--tokenizer", help="tokenizer.json: vocabulary follows it and it is copied into --out")
    init.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    init.add_argument("--out", required=True, help="output directory")
    init.set_defaults(func=_init)
    info = sub.add_parser("info", help="config, parameter counts and cache sizes of a checkpoint")
    info.add_argument("dir")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=_info)
