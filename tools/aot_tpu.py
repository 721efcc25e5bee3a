"""Compile a preset's prefill and decode step, or its training step, ahead of time for a TPU topology, on a
CPU-only machine.

    python tools/aot_tpu.py --preset qwen3.5-397b-a17b --topology v5p:4x4x8 \
        --mesh data=1,fsdp=8,tensor=4,expert=4 --dtype bfloat16 --batch 8 --seq 2048 --cache-len 4096
    python tools/aot_tpu.py --step train --preset qwen3.5-397b-a17b --topology v5p:4x4x8 \
        --mesh fsdp=32,expert=4 --batch 32 --seq 4096 [--micro-batches 4]

`--step train` compiles searchjax.train's step (forward + backward with per-layer remat + clipped AdamW update) over
a TrainState whose params are bfloat16 and whose optimizer moments are float32, under the same sharding rules.

Needs libtpu (`pip install -e ".[tpu]"`). The topology comes from
`jax.experimental.topologies.get_topology_desc`; parameters, cache and tokens are ShapeDtypeStructs carrying the
project's shardings (searchjax.sharding rules), so nothing is allocated. For each step it prints the per-chip
memory from `memory_analysis()` (arguments + outputs + temporaries − donated aliases) against the chip's HBM, and
the FLOPs from `cost_analysis()` (XLA counts the body of a while loop once, so a scan over layers is
undercounted; 2 × active parameters × tokens is printed beside it). Exit code 1 when a step does not fit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# Per-chip HBM in GiB by `device_kind` (public TPU specifications).
HBM_GIB = {"TPU v4": 32, "TPU v5 lite": 16, "TPU v5e": 16, "TPU v5": 95, "TPU v5p": 95, "TPU v6 lite": 32, "TPU v6e": 32}


def parse_mesh(text: str) -> dict[str, int]:
    """'data=1,fsdp=8,tensor=4' -> {'data': 1, 'fsdp': 8, 'tensor': 4}."""
    out = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"--mesh: expected name=int pairs separated by commas, got {part!r} in {text!r}")
        out[name.strip()] = int(value)
    return out


def _sds(shape_dtype, sharding):
    import jax

    return jax.ShapeDtypeStruct(shape_dtype.shape, shape_dtype.dtype, sharding=sharding)


def abstract_inputs(cfg, mesh, dtype: str, batch: int, seq: int, cache_len: int):
    """(params, prefill tokens, decode tokens, lengths, cache): ShapeDtypeStructs with shardings on `mesh`."""
    import jax
    import jax.numpy as jnp

    from searchjax.model import abstract_params, cache_shapes, cache_shardings
    from searchjax.sharding import logical_sharding

    params = abstract_params(cfg, dtype, mesh)
    cache = jax.tree.map(
        _sds, cache_shapes(cfg, batch, cache_len, dtype), cache_shardings(cfg, batch, cache_len, mesh, dtype)
    )
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=logical_sharding(mesh, ("batch", "seq"), (batch, seq)))
    row = logical_sharding(mesh, ("batch",), (batch,))
    step_tokens = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=row)
    lengths = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=row)
    return params, tokens, step_tokens, lengths, cache


def _report(name: str, compiled, hbm_bytes: int, seconds: float, model_flops: float) -> dict:
    mem = compiled.memory_analysis()
    per_chip = (
        mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes - mem.alias_size_in_bytes
    )
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {
        "step": name,
        "compile_s": round(seconds, 1),
        "per_chip_bytes": int(per_chip),
        "arguments_bytes": int(mem.argument_size_in_bytes),
        "temp_bytes": int(mem.temp_size_in_bytes),
        "hbm_bytes": hbm_bytes,
        "hbm_fraction": per_chip / hbm_bytes,
        "flops_per_chip": float(cost.get("flops", float("nan"))),
        "model_flops_per_chip": model_flops,
        "fits": per_chip <= hbm_bytes,
    }


def compile_steps(preset: str, topology: str, mesh_shape: dict[str, int], dtype: str, batch: int, seq: int,
                  cache_len: int) -> list[dict]:
    """AOT-compile prefill and decode_step of `preset` for `topology`; one report dict per step."""
    from jax.experimental import topologies

    from searchjax.model import decode_step, load_preset, param_count, prefill
    from searchjax.sharding import make_mesh

    topo = topologies.get_topology_desc(platform="tpu", topology_name=topology)
    kind = topo.devices[0].device_kind
    if kind not in HBM_GIB:
        raise ValueError(f"unknown TPU device kind {kind!r}; known: {sorted(HBM_GIB)}")
    hbm = HBM_GIB[kind] * 2**30
    mesh = make_mesh(mesh_shape, devices=topo.devices)
    # The host is a CPU, so "auto" would pick the CPU block dispatch; a TPU run uses ragged_dot. The DeltaNet chunk
    # default (16) suits the CPU; HF/FLA's 64 gives the TPU's 128-wide matrix units larger matmuls (not measured).
    cfg = load_preset(preset).replace(moe_impl="ragged", chunk_size=64)
    params, tokens, step_tokens, lengths, cache = abstract_inputs(cfg, mesh, dtype, batch, seq, cache_len)
    # 2 FLOPs per active parameter per token (matmuls only; attention scores excluded), split over the chips.
    per_token = 2 * param_count(cfg, active=True) / len(topo.devices)
    reports = []
    for name, fn, args, n_tokens in (
        ("prefill", prefill, (params, tokens, cfg, cache, lengths), batch * seq),
        ("decode_step", decode_step, (params, step_tokens, cfg, cache), batch),
    ):
        t0 = time.perf_counter()
        compiled = fn.lower(*args).compile()
        reports.append(_report(name, compiled, hbm, time.perf_counter() - t0, per_token * n_tokens))
    return reports


def train_inputs(cfg, mesh, batch: int, seq: int, micro_batches: int):
    """(jitted train step, abstract TrainState, abstract batch): bf16 params, float32 Adam moments, sharded."""
    import jax
    import jax.numpy as jnp

    from searchjax.model import abstract_params, param_shardings
    from searchjax.train.causal import BATCH_KEYS, next_token_loss
    from searchjax.train.config import OptimConfig
    from searchjax.train.optim import lr_schedule, make_optimizer
    from searchjax.train.state import abstract_state
    from searchjax.train.step import batch_sharding, make_train_step

    ocfg = OptimConfig(micro_batches=micro_batches)
    tx = make_optimizer(ocfg, 10_000)
    state = abstract_state(tx, abstract_params(cfg, "bfloat16", mesh), param_shardings(cfg, mesh), mesh)
    f32 = lambda x: _sds(jax.ShapeDtypeStruct(x.shape, jnp.float32), x.sharding) if x.dtype == jnp.bfloat16 else x
    state = state.replace(opt_state=jax.tree.map(f32, state.opt_state))
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=batch_sharding(mesh, (batch, seq)))
    lengths = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=batch_sharding(mesh, (batch,)))
    loss = next_token_loss(cfg, remat=True, chunk=4096, aux_coef=cfg.router_aux_loss_coef)
    step = make_train_step(loss, tx, micro_batches=micro_batches, lr_fn=lr_schedule(ocfg, 10_000), mesh=mesh,
                           state_shardings=jax.tree.map(lambda x: x.sharding, state))
    return step, state, {k: lengths if k == "lengths" else tokens for k in BATCH_KEYS}


def compile_train(preset: str, topology: str, mesh_shape: dict[str, int], batch: int, seq: int,
                  micro_batches: int) -> list[dict]:
    """AOT-compile the training step of `preset` for `topology`; one report."""
    from jax.experimental import topologies

    from searchjax.model import load_preset
    from searchjax.sharding import make_mesh
    from searchjax.train.flops import model_flops

    topo = topologies.get_topology_desc(platform="tpu", topology_name=topology)
    kind = topo.devices[0].device_kind
    if kind not in HBM_GIB:
        raise ValueError(f"unknown TPU device kind {kind!r}; known: {sorted(HBM_GIB)}")
    mesh = make_mesh(mesh_shape, devices=topo.devices)
    cfg = load_preset(preset).replace(moe_impl="ragged", chunk_size=64)
    step, state, tokens = train_inputs(cfg, mesh, batch, seq, micro_batches)
    t0 = time.perf_counter()
    compiled = step.lower(state, tokens).compile()
    report = _report("train", compiled, HBM_GIB[kind] * 2**30, time.perf_counter() - t0,
                     model_flops(cfg, batch, seq, backward=True) / len(topo.devices))
    return [{**report, "tokens_per_step": batch * seq, "micro_batches": micro_batches}]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", required=True)
    ap.add_argument("--topology", required=True, help="e.g. v5p:4x4x8, v6e:8x8, v5e:2x2")
    ap.add_argument("--mesh", required=True, help="data=1,fsdp=8,tensor=4,expert=4 (product = number of chips)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048, help="prefill length T")
    ap.add_argument("--cache-len", type=int, default=4096, help="cache length S")
    ap.add_argument("--json", action="store_true", help="print one JSON object per step")
    ap.add_argument("--step", choices=("inference", "train"), default="inference",
                    help="inference: prefill + decode_step; train: the training step")
    ap.add_argument("--micro-batches", type=int, default=1, help="gradient accumulation of --step train")
    args = ap.parse_args(argv)
    # libtpu looks for TPU workers at start-up; on a CPU machine there are none (AOT needs no TPU).
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    if args.step == "train":
        reports = compile_train(args.preset, args.topology, parse_mesh(args.mesh), args.batch, args.seq,
                                args.micro_batches)
    else:
        reports = compile_steps(args.preset, args.topology, parse_mesh(args.mesh), args.dtype, args.batch,
                                args.seq, args.cache_len)
    for r in reports:
        if args.json:
            print(json.dumps(r))
        else:
            print(
                f"{args.preset} {args.topology} mesh={args.mesh} {args.dtype} B={args.batch} T={args.seq} "
                f"S={args.cache_len} | {r['step']}: {r['per_chip_bytes'] / 2**30:.2f} GiB/chip of "
                f"{r['hbm_bytes'] / 2**30:.0f} GiB HBM ({100 * r['hbm_fraction']:.1f}%), "
                f"XLA cost_analysis {r['flops_per_chip']:.3g} FLOP/chip (2·active params·tokens: "
                f"{r['model_flops_per_chip']:.3g}), compiled in {r['compile_s']} s"
                + ("" if r["fits"] else "  DOES NOT FIT")
            )
    return 0 if all(r["fits"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
