"""Benchmarks for the reward and loss maths, measured side by side in one run.

1. rewards: the full reward computation (tool baseline draw, anchored penalties, gating, advantages) for
   4,096 groups × 16 rollouts, one jitted `compute_rewards` call vs the per-rollout Python implementation
   (searchjax.rewards.reference) on the same inputs; outputs are checked equal on the same b_g.
2. memory: grpo_loss + gradient (w.r.t. hidden states and the unembedding) with chunked log-probs at
   B=4, T=512, D=512, V=248,320 vs the same loss through full float32 logits. Memory is XLA's own
   `compiled.memory_analysis()` of the jitted value-and-grad: temp + output bytes (arguments excluded: both
   variants take the same hidden [B,T,D] and unembed [V,D]). `--run` also executes the chunked step once.

    JAX_PLATFORMS=cpu python tools/bench_rewards.py [--groups 4096] [--group-size 16] [--run]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from searchjax.losses import grpo_loss, token_logprobs, token_logprobs_from_logits
from searchjax.rewards import RewardConfig, RolloutRecords, compute_rewards
from searchjax.rewards.reference import draw_baselines_python, reference_rewards


def make_records(n: int, g: int, seed: int = 0) -> RolloutRecords:
    rng = np.random.default_rng(seed)
    calls = rng.integers(0, 8, (n, g))
    mask = np.ones((n, g), bool)
    mask[rng.random(n) < 0.05, g // 2:] = False  # a few partly padded groups
    return RolloutRecords(
        correct=(rng.random((n, g)) < 0.4).astype(np.float32),
        preference=rng.random((n, g)).astype(np.float32),
        calls=calls,
        failures=np.minimum(rng.integers(0, 3, (n, g)), calls),
        lengths=rng.integers(0, 4000, (n, g)).astype(np.float32),
        ref_lengths=rng.integers(50, 4000, (n, g)).astype(np.float32),
        mask=mask,
    )


def bench_rewards(n: int, g: int, repeats: int = 20) -> None:
    cfg = RewardConfig()
    batch = make_records(n, g)
    device_batch = jax.device_put(batch)
    fn = jax.jit(compute_rewards, static_argnames="cfg")
    key = jax.random.PRNGKey(0)
    out = jax.block_until_ready(fn(device_batch, cfg, key))  # compile
    ours = []
    for i in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(device_batch, cfg, jax.random.PRNGKey(i)))
        ours.append(time.perf_counter() - start)
    lists = {k: np.asarray(getattr(batch, k)).tolist() for k in batch.__dataclass_fields__}
    python = []
    for i in range(5):
        start = time.perf_counter()
        baselines = draw_baselines_python(lists, random.Random(i))
        reference_rewards(lists, baselines, cfg)
        python.append(time.perf_counter() - start)
    ref = reference_rewards(lists, np.asarray(out.tool_baseline).tolist(), cfg)
    err = float(np.abs(np.asarray(out.reward) - np.asarray(ref["reward"])).max())
    # The best of several runs on each side: on a shared machine other jobs only ever add time.
    t_ours, t_py = min(ours), min(python)
    print(f"[rewards] {n} groups x {g} rollouts: jitted compute_rewards {t_ours * 1e3:.2f} ms (best of {repeats}; "
          f"median {statistics.median(ours) * 1e3:.2f}), per-rollout Python {t_py * 1e3:.0f} ms (best of "
          f"{len(python)}; median {statistics.median(python) * 1e3:.0f}): speed-up {t_py / t_ours:.0f}x "
          f"(medians: {statistics.median(python) / statistics.median(ours):.0f}x); "
          f"max |R_ours - R_python| on the same b_g = {err:.2e}")


def _loss(hidden, unembed, targets, logp_infer, adv, mask, chunked: bool):
    if chunked:
        logp = token_logprobs(hidden, unembed, targets)
    else:
        logits = jnp.einsum("BTD,VD->BTV", hidden, unembed, preferred_element_type=jnp.float32)
        logp = token_logprobs_from_logits(logits, targets)
    return grpo_loss(logp, logp_infer, adv, mask, is_cap=2.0)[0]


def bench_memory(b: int, t: int, d: int, v: int, dtype, run: bool) -> None:
    hidden = jax.ShapeDtypeStruct((b, t, d), dtype)
    unembed = jax.ShapeDtypeStruct((v, d), dtype)
    rest = (jax.ShapeDtypeStruct((b, t), jnp.int32), jax.ShapeDtypeStruct((b, t), jnp.float32),
            jax.ShapeDtypeStruct((b,), jnp.float32), jax.ShapeDtypeStruct((b, t), jnp.bool_))
    logits_bytes = b * t * v * 4
    stats = {}
    for chunked in (True, False):
        step = jax.jit(jax.value_and_grad(lambda h, w, *r: _loss(h, w, *r, chunked=chunked), argnums=(0, 1)))
        start = time.perf_counter()
        compiled = step.lower(hidden, unembed, *rest).compile()
        mem = compiled.memory_analysis()
        stats[chunked] = (mem.temp_size_in_bytes, mem.output_size_in_bytes, mem.argument_size_in_bytes,
                          time.perf_counter() - start, compiled)
    gib = 2**30
    name = jnp.dtype(dtype).name
    for chunked, (temp, out, args, _, _) in stats.items():
        label = "chunked" if chunked else "full-logits"
        print(f"[memory] B={b} T={t} D={d} V={v} {name} params, {label}: temp {temp / gib:.3f} GiB + output "
              f"{out / gib:.3f} GiB = {(temp + out) / gib:.3f} GiB ({(temp + out) / logits_bytes:.2f}x the "
              f"{logits_bytes / gib:.2f} GiB of fp32 logits); arguments {args / gib:.3f} GiB")
    ours, full = stats[True][0] + stats[True][1], stats[False][0] + stats[False][1]
    print(f"[memory] {name}: chunked / full-logits (temp + output) = {ours / full:.3f}")
    if run:
        rng = np.random.default_rng(0)
        args = (jnp.asarray(rng.normal(size=(b, t, d)), dtype), jnp.asarray(rng.normal(size=(v, d)) / 30, dtype),
                jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32), jnp.full((b, t), -5.0, jnp.float32),
                jnp.asarray(rng.normal(size=b), jnp.float32), jnp.ones((b, t), bool))
        start = time.perf_counter()
        jax.block_until_ready(stats[True][4](*args))
        print(f"[memory] {name}: one chunked value-and-grad step ran in {time.perf_counter() - start:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=4096)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--run", action="store_true", help="also execute one chunked loss+gradient step")
    args = parser.parse_args()
    print(f"devices: {jax.devices()}")
    bench_rewards(args.groups, args.group_size)
    for dtype in (jnp.float32, jnp.bfloat16):
        bench_memory(4, 512, 512, 248_320, dtype, args.run)


if __name__ == "__main__":
    main()
