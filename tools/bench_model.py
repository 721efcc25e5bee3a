"""Model benchmarks on this machine, every figure a ratio measured side by side in one run (preset `small`).

    JAX_PLATFORMS=cpu python tools/bench_model.py [--quick]

1. prefill tokens/s, ours ÷ transformers (same weights via save_hf, batch 4×512)            target ≥ 3
2. decode tokens/s at batch 16, ours (prefill + decode_step loop) ÷ transformers generate    target ≥ 5
3. forward+backward FLOP/s of the SFT step (hidden_states + sft_loss) ÷ fp32 matmul peak in this run  target ≥ 0.35
4. MoE sparsity: fwd+bwd step time with 64 experts top-4 ÷ 8 experts top-4 (same active size) target ≤ 1.3
5. DeltaNet: chunked time T=4096 ÷ T=512                                                    target ≤ 10
             recurrent ÷ chunked time at T=4096 (batch 1, and batch 4 as in the prefill)    target ≥ 5
Beside 1 and 2 it prints what the machine allows: transformers' useful forward FLOP/s as a share of the peak (the
prefill ratio cannot exceed peak ÷ that rate) and the weight bytes a decode step must read over the measured DRAM
read rate (the decode ratio cannot exceed transformers' step time ÷ that floor).
Timings are the minimum over repetitions after a warm-up (the machine is shared; the minimum is the least noisy).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from searchjax.train.flops import model_flops


def best_time(fn, reps: int) -> float:
    """Minimum wall time of fn() over `reps` runs after one warm-up (fn must block until done)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def matmul_peak(reps: int) -> float:
    """fp32 FLOP/s of a 2048³ matmul in JAX: the machine's practical peak."""
    n = 2048
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(lambda a, b: a @ b)
    return 2 * n**3 / best_time(lambda: f(a, a).block_until_ready(), reps)


def _hf_model(params, cfg):
    import torch
    from transformers import Qwen3_5MoeForCausalLM

    from searchjax.model import save_hf

    with tempfile.TemporaryDirectory() as d:
        save_hf(d, params, cfg)
        model = Qwen3_5MoeForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    return model


def bench_prefill(params, cfg, hf, reps: int, batch=4, seq=512) -> dict:
    import torch

    from searchjax.model import forward

    tokens = np.random.default_rng(0).integers(3, cfg.vocab_size, (batch, seq)).astype(np.int32)
    ours = best_time(lambda: forward(params, jnp.asarray(tokens), cfg).block_until_ready(), reps)
    ids = torch.from_numpy(tokens.astype(np.int64))
    with torch.inference_mode():
        ref_logits = hf(ids, use_cache=False).logits.numpy()
        theirs = best_time(lambda: hf(ids, use_cache=False), reps)
    err = float(np.abs(np.asarray(forward(params, jnp.asarray(tokens), cfg)) - ref_logits).max())
    return {"ours_tok_s": batch * seq / ours, "hf_tok_s": batch * seq / theirs, "ratio": theirs / ours,
            "max_abs_logit_diff": err}


def _our_generate(params, cfg, prompt: np.ndarray, new: int) -> np.ndarray:
    """Greedy: prefill the prompt into a cache, then `new`−1 decode steps (the first token comes from prefill)."""
    from searchjax.model import decode_step, init_cache, prefill

    b, t = prompt.shape
    cache = init_cache(cfg, b, t + new)
    logits, cache = prefill(params, jnp.asarray(prompt), cfg, cache, jnp.full((b,), t, jnp.int32))
    tok = jnp.argmax(logits[:, -1], -1).astype(jnp.int32)
    out = [tok]
    for _ in range(new - 1):
        logits, cache = decode_step(params, tok, cfg, cache)
        tok = jnp.argmax(logits, -1).astype(jnp.int32)
        out.append(tok)
    return np.asarray(jnp.stack(out, 1))


def bench_decode(params, cfg, hf, reps: int, batch=16, prompt_len=32, new=64) -> dict:
    import torch

    prompt = np.random.default_rng(1).integers(3, cfg.vocab_size, (batch, prompt_len)).astype(np.int32)
    ours = best_time(lambda: _our_generate(params, cfg, prompt, new), reps)
    ids = torch.from_numpy(prompt.astype(np.int64))
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=0)
    with torch.inference_mode():
        theirs = best_time(lambda: hf.generate(ids, attention_mask=torch.ones_like(ids), **kw), reps)
        same = float((hf.generate(ids, attention_mask=torch.ones_like(ids), **kw)[:, prompt_len:].numpy()
                      == _our_generate(params, cfg, prompt, new)).mean())
    return {"ours_tok_s": batch * new / ours, "hf_tok_s": batch * new / theirs, "ratio": theirs / ours,
            "greedy_token_agreement": same}


def _train_step(cfg):
    """The library's SFT step: final hidden states, then the chunked next-token NLL of `losses.sft_loss`
    (log-probs scanned over vocabulary chunks; the training losses never build [B, T, V] logits)."""
    from searchjax.losses import sft_loss
    from searchjax.model import hidden_states

    def loss(params, tokens):
        h = hidden_states(params, tokens[:, :-1], cfg)
        return sft_loss(h, params.unembed, tokens[:, 1:], jnp.ones(tokens[:, 1:].shape, bool))[0]

    return jax.jit(jax.value_and_grad(loss))


def step_time(cfg, reps: int, batch: int, seq: int) -> float:
    from searchjax.model import init_params

    params = init_params(cfg, jax.random.key(0))
    tokens = jnp.asarray(np.random.default_rng(2).integers(3, cfg.vocab_size, (batch, seq + 1)), jnp.int32)
    step = _train_step(cfg)
    return best_time(lambda: jax.block_until_ready(step(params, tokens)), reps)


def train_flops(cfg, batch: int, seq: int) -> float:
    return model_flops(cfg, batch, seq, backward=True)


def read_bandwidth(reps: int, mib: int = 512) -> float:
    """Bytes/s of a jitted sum over a `mib` MiB fp32 array (far larger than the caches): the DRAM read rate."""
    x = jnp.ones((mib * 2**20 // 4,), jnp.float32)
    f = jax.jit(jnp.sum)
    return x.nbytes / best_time(lambda: f(x).block_until_ready(), reps)


def decode_bytes_per_step(cfg, batch: int) -> float:
    """A lower bound on the weight bytes one decode step of `batch` rows must read (fp32): every non-expert matmul
    weight (the [V, D] embedding table only for the rows read) plus, per MoE layer, the experts the step hits —
    E·(1 − (1 − k/E)^B) of them on average when each row picks k distinct experts uniformly (the router of a
    randomly initialised model is close to uniform)."""
    from searchjax.model import param_count

    e, k = cfg.num_experts, cfg.num_experts_per_tok
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    routed = per_expert * e * cfg.num_hidden_layers
    dense = param_count(cfg) - routed - cfg.vocab_size * cfg.hidden_size
    hit = e * (1.0 - (1.0 - k / e) ** batch)
    return 4.0 * (dense + hit * per_expert * cfg.num_hidden_layers + batch * cfg.hidden_size)


def bench_deltanet(reps: int, chunks=(64, 16), b=1, nv=4, dk=64, dv=64) -> dict:
    """Small preset's DeltaNet dims (4 value heads, 64×64), batch b: the jitted lax.scan of recurrent_delta_step
    vs chunked_delta_rule at each chunk size (64 = the config/HF default; 16 suits the CPU best)."""
    from searchjax.model.deltanet import chunked_delta_rule, recurrent_delta_step

    def inputs(t):
        ks = jax.random.split(jax.random.key(3), 5)
        q = jax.random.normal(ks[0], (b, t, nv, dk))
        k = jax.random.normal(ks[1], (b, t, nv, dk))
        q, k = (x / jnp.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
        v = jax.random.normal(ks[2], (b, t, nv, dv))
        g = -jax.nn.softplus(jax.random.normal(ks[3], (b, t, nv)))
        beta = jax.nn.sigmoid(jax.random.normal(ks[4], (b, t, nv)))
        return q, k, v, g, beta, jnp.zeros((b, nv, dk, dv))

    def scan(q, k, v, g, beta, s):
        step = lambda s, x: recurrent_delta_step(*x, s)[::-1]  # noqa: E731
        s, o = jax.lax.scan(step, s, tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta)))
        return jnp.moveaxis(o, 0, 1), s

    recurrent = jax.jit(scan)
    small, big = inputs(512), inputs(4096)
    trec = best_time(lambda: jax.block_until_ready(recurrent(*big)), max(1, reps // 2))
    out = {"recurrent_4096_s": trec, "chunks": {}}
    for c in chunks:
        chunked = jax.jit(lambda *a, c=c: chunked_delta_rule(*a, chunk=c))
        t512 = best_time(lambda: jax.block_until_ready(chunked(*small)), reps)
        t4096 = best_time(lambda: jax.block_until_ready(chunked(*big)), reps)
        diff = float(jnp.abs(chunked(*big)[0] - recurrent(*big)[0]).max())
        out["chunks"][c] = {"chunked_512_s": t512, "chunked_4096_s": t4096, "scaling_4096_over_512": t4096 / t512,
                            "recurrent_over_chunked": trec / t4096, "max_abs_diff": diff}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = ap.parse_args(argv)
    reps = 2 if args.quick else 5

    from searchjax.model import init_params, load_preset

    cfg = load_preset("small")
    params = init_params(cfg, jax.random.key(0))
    hf = _hf_model(params, cfg)
    peak = matmul_peak(reps)
    bw = read_bandwidth(reps)
    print(f"fp32 matmul peak (2048³, JAX): {peak / 1e9:.1f} GFLOP/s; DRAM read (sum of 512 MiB): {bw / 1e9:.1f} GB/s",
          flush=True)
    p = bench_prefill(params, cfg, hf, reps)
    fwd = model_flops(cfg, 4, 512, backward=False)
    hf_rate, our_rate = fwd * p["hf_tok_s"] / 2048, fwd * p["ours_tok_s"] / 2048
    print(f"prefill 4×512: ours {p['ours_tok_s']:.0f} tok/s, transformers {p['hf_tok_s']:.0f} tok/s, "
          f"ratio {p['ratio']:.2f} (target ≥ 3); max |Δlogit| {p['max_abs_logit_diff']:.2e}\n"
          f"  useful forward FLOP/s: ours {our_rate / 1e9:.1f} G = {our_rate / peak:.2f} of peak, transformers "
          f"{hf_rate / 1e9:.1f} G = {hf_rate / peak:.2f} of peak -> ratio at most {peak / hf_rate:.2f} at 100% of "
          f"peak", flush=True)
    d = bench_decode(params, cfg, hf, reps)
    floor = decode_bytes_per_step(cfg, 16) / bw
    hf_step, our_step = 16 / d["hf_tok_s"], 16 / d["ours_tok_s"]
    print(f"decode batch 16 (32-token prompt, 64 new): ours {d['ours_tok_s']:.0f} tok/s, transformers generate "
          f"{d['hf_tok_s']:.0f} tok/s, ratio {d['ratio']:.2f} (target ≥ 5); greedy agreement "
          f"{d['greedy_token_agreement']:.3f}\n"
          f"  per step: ours {our_step * 1e3:.1f} ms, transformers {hf_step * 1e3:.1f} ms; weight-read floor "
          f"{decode_bytes_per_step(cfg, 16) / 1e6:.0f} MB / {bw / 1e9:.1f} GB/s = {floor * 1e3:.1f} ms -> ratio at "
          f"most {hf_step / floor:.2f} at the memory floor", flush=True)
    b, t = 4, 512
    t64 = step_time(cfg, reps, b, t)
    frac = train_flops(cfg, b, t) / t64 / peak
    print(f"fwd+bwd 4×512: {train_flops(cfg, b, t) / t64 / 1e9:.1f} GFLOP/s = {frac:.2f} of peak (target ≥ 0.35)",
          flush=True)
    t8 = step_time(cfg.replace(num_experts=8), reps, b, t)
    print(f"MoE step time 64 experts ÷ 8 experts (top-4, same active size): {t64:.3f}s / {t8:.3f}s = "
          f"{t64 / t8:.2f} (target ≤ 1.3)", flush=True)
    for batch in (1, 4):
        for c, dn in bench_deltanet(reps, b=batch)["chunks"].items():
            print(f"DeltaNet (batch {batch}, chunk {c}) chunked T=4096 ÷ T=512: {dn['scaling_4096_over_512']:.2f} "
                  f"(target ≤ 10); recurrent ÷ chunked at T=4096: {dn['recurrent_over_chunked']:.2f} (target ≥ 5); "
                  f"max |Δo| {dn['max_abs_diff']:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
