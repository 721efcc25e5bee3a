"""`searchjax demo`: the main job on the embedded default.

For now: build the tiny preset, save and reload it through the HF checkpoint path, run a forward pass and a batched
greedy decode with the cache, and print what it did with tokens/s.
"""

from __future__ import annotations

import argparse
import tempfile
import time


def run_demo(args: argparse.Namespace) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from searchjax.model import forward, init_params, load_hf, load_preset, param_count, save_hf
    from searchjax.model.generate import greedy_generate

    cfg = load_preset(args.preset)
    params = init_params(cfg, jax.random.key(args.seed))
    with tempfile.TemporaryDirectory() as tmp:
        save_hf(tmp, params, cfg)
        cfg, params = load_hf(tmp)
    print(f"model: preset {args.preset!r}, {param_count(cfg):,} parameters, saved and reloaded in HF format")
    b, t = args.batch, args.prompt_len
    prompts = jax.random.randint(jax.random.key(args.seed + 1), (b, t), 0, cfg.vocab_size, dtype=jnp.int32)
    lengths = jnp.asarray(np.linspace(t, max(1, t // 2), b).astype(np.int32))  # rows of different lengths
    jax.block_until_ready(forward(params, prompts, cfg))  # compile
    start = time.perf_counter()
    logits = jax.block_until_ready(forward(params, prompts, cfg))
    dt = time.perf_counter() - start
    print(f"forward: {b}x{t} tokens -> logits {tuple(logits.shape)} in {dt * 1e3:.1f} ms ({b * t / dt:,.0f} tokens/s)")
    greedy_generate(params, cfg, prompts, lengths, args.new_tokens).block_until_ready()  # compile
    start = time.perf_counter()
    out = greedy_generate(params, cfg, prompts, lengths, args.new_tokens).block_until_ready()
    dt = time.perf_counter() - start
    print(f"greedy decode: batch {b}, prompt lengths {np.asarray(lengths).tolist()}, {args.new_tokens} new tokens "
          f"per row in {dt * 1e3:.1f} ms ({b * args.new_tokens / dt:,.0f} tokens/s, prefill included)")
    for row in np.asarray(out)[: min(b, 2)]:
        print("  generated:", row.tolist())
    return 0


def register(subparsers) -> None:
    demo = subparsers.add_parser("demo", help="run the main job on the embedded default (tiny model, CPU)")
    demo.add_argument("--preset", default="tiny")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--batch", type=int, default=4)
    demo.add_argument("--prompt-len", type=int, default=16)
    demo.add_argument("--new-tokens", type=int, default=16)
    demo.set_defaults(func=run_demo)
