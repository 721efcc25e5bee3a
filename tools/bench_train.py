"""Training-loop benchmarks (issue 10 §7), every figure a ratio measured side by side in one run.

    JAX_PLATFORMS=cpu python tools/bench_train.py [--preset small] [--steps 24] [--save-every 8] [--batch 2] \
        [--pack-len 4096]

1. the SFT loop's useful FLOP/s ÷ this machine's fp32 matmul peak (measured here), beside the bare step's
2. loop ÷ bare jitted step: the same step function on the run's own batches of the same shapes, timed alone
   (BARE_RUN steps dispatched back to back, median of 3 such runs)                          target ≥ 0.95
   (data, metrics and checkpointing hidden behind the device)
3. non-padding share of trained tokens: the loop's batches (packed rows of --pack-len tokens; --pack-len 0:
   length buckets 1024/1536/2048), beside the bucketed batches of the same data at 2× the batch    target ≥ 0.9
4. checkpoint save and restore time of the preset's train state, and the host memory peak while restoring
   ÷ the state's bytes (one host's shard in a 1-process run)                               target ≤ 1.5
The SFT data comes from a small offline world (trajectories with 3 results per search, a 4,096-id BPE on the
corpus + rendered trajectories), built in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import jax
import numpy as np

from searchjax.train.flops import model_flops


BARE_RUN = 4


def matmul_peak(reps: int = 5) -> float:
    n = 2048
    a = jax.random.normal(jax.random.key(0), (n, n))
    f = jax.jit(lambda a, b: a @ b)
    f(a, a).block_until_ready()
    best = min(_timed(lambda: f(a, a).block_until_ready()) for _ in range(reps))
    return 2 * n**3 / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def build_data(d: Path, preset: str) -> tuple[Path, Path]:
    from searchjax.chat import render, train_tokenizer
    from searchjax.data.jsonl import write_jsonl
    from searchjax.data.sft import SFTBuilder
    from searchjax.data.solvers import SearchSolver
    from searchjax.data.synth import QAGenerator, SynthConfig
    from searchjax.model import init_params, load_preset, save_hf
    from searchjax.search import SEARCH_WEB_TOOL, TantivyBackend, build_index
    from searchjax.search.world import KnowledgeBase, build_world

    build_world(d / "world", seed=0, n_docs=1500, n_real_cities=20, progress=False)
    build_index(d / "world" / "corpus.jsonl", d / "index", progress=False)
    kb, backend = KnowledgeBase.load(d / "world"), TantivyBackend(d / "index")
    qa = list(QAGenerator(kb, SearchSolver(backend), SynthConfig(n=300, seed=0, augment_fraction=0.0,
                                                                  dev_fraction=0.0)).generate())
    sft = list(SFTBuilder(kb, backend, seed=0, max_results=3).build(qa, n_abstention=20))
    write_jsonl(d / "sft.jsonl", sft)
    (d / "rendered.txt").write_text("\n".join(render(r["messages"], [SEARCH_WEB_TOOL]) for r in sft))
    tok = train_tokenizer([d / "world" / "corpus.jsonl", d / "rendered.txt"], 4096, d / "tok.json")
    cfg = load_preset(preset).replace(vocab_size=tok.vocab_size)
    save_hf(d / "model", init_params(cfg, jax.random.key(0)), cfg)
    (d / "model" / "tokenizer.json").write_bytes((d / "tok.json").read_bytes())
    return d / "sft.jsonl", d / "model"


def _train_batches(cfg, tokenizer, batch_size: int, bucketed: bool = False):
    """(iterator, step keys) of the SFT stage's training batches (numpy, this process's rows), as
    `searchjax.train.sft` builds them (bucketed=True: the same config's length buckets, even when it packs)."""
    import dataclasses

    from searchjax.data.pipeline import Encoder, load_sources
    from searchjax.train import sft

    if bucketed:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, pack_len=0))
    pipe = sft._pipeline(cfg, cfg.data.sources)
    records, _ = sft.split_records(cfg, load_sources(pipe)[0])
    return sft.train_batches(cfg, Encoder(tokenizer, pipe), records, batch_size)


def bucketed_nonpad(cfg, model, batch_size: int, steps: int) -> float:
    """Real-token share of the first `steps` length-bucketed batches of `batch_size` rows of the same data."""
    from searchjax.chat import load_tokenizer

    it, _ = _train_batches(cfg, load_tokenizer(Path(model) / "tokenizer.json"), batch_size, bucketed=True)
    batches = [next(it) for _ in range(steps)]
    return float(sum(b["lengths"].sum() for b in batches) / sum(b["input_ids"].size for b in batches))


def first_batches(cfg, start) -> dict[int, dict[str, np.ndarray]]:
    """The first training batch of each width among the run's first 4·steps batches (the step's arrays only)."""
    it, keys = _train_batches(cfg, start.tokenizer, cfg.batch_size)
    out = {}
    for _ in range(4 * cfg.steps):
        b = next(it)
        out.setdefault(b["input_ids"].shape[1], {k: b[k] for k in keys})
    return out


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class PeakRSS:
    """Samples this process's resident memory every millisecond while active."""

    def __enter__(self):
        self.base, self.peak, self._stop = rss_bytes(), rss_bytes(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--save-every", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2, help="rows per step (packed rows hold ~3 examples)")
    ap.add_argument("--pack-len", type=int, default=4096, help="packed row length (0: length buckets)")
    args = ap.parse_args(argv)

    from searchjax.config import configs_dir
    from searchjax.data.lm import lm_dataset
    from searchjax.train import sft
    from searchjax.train.causal import next_token_loss, start_model
    from searchjax.train.checkpoint import Checkpointer
    from searchjax.train.config import load_train_config
    from searchjax.train.optim import lr_schedule, make_optimizer
    from searchjax.train.runner import run_mesh
    from searchjax.train.state import abstract_state, create_state
    from searchjax.train.step import device_batch, make_train_step

    peak = matmul_peak()
    print(f"fp32 matmul peak (2048³): {peak / 1e9:.1f} GFLOP/s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        data, model = build_data(d, args.preset)
        buckets = ["data.buckets=[1024,1536,2048]", "data.window_batches=16"]
        overrides = [f"steps={args.steps}", f"batch_size={args.batch}", "log_every=1", "eval_every=0",
                     f"save_every={args.save_every}", "progress=false", "data.max_len=2048",
                     f"data.pack_len={args.pack_len}", "data.pack_bins=16", *buckets]
        cfg = sft.with_files(load_train_config(sft.SFTConfig, configs_dir() / "train" / "sft_science.yaml",
                                               overrides), [str(data)], None)
        summary = sft.run_sft(cfg, model, d / "run")
        bucketed_share = bucketed_nonpad(cfg, model, 2 * args.batch, args.steps)
        rows = [json.loads(x) for x in (d / "run" / "metrics.jsonl").read_text().splitlines()]
        # Timed: steps whose width was compiled before, and whose successor's was too. The loop reads step t's
        # metrics after dispatching step t + 1, and dispatching a new width compiles it first, so step t's
        # perf/step_time_s then holds that compilation.
        steps = [r for r in rows if "data/width" in r]
        first = {}
        for i, r in enumerate(steps):
            first.setdefault(r["data/width"], i)
        loop_t, loop_steps = [], []
        for i, r in enumerate(steps):
            nxt = steps[i + 1]["data/width"] if i + 1 < len(steps) else r["data/width"]
            if "perf/step_time_s" in r and first[r["data/width"]] < i and first[nxt] <= i:
                loop_t.append(r["perf/step_time_s"])
                loop_steps.append(r)
        nonpad = np.mean([r["data/nonpad_frac"] for r in rows if "data/nonpad_frac" in r])

        # The bare step: the same loss, optimizer and shapes, on device-resident batches (the run's own first
        # batch of each width, segments included), no loop around it.
        mesh = run_mesh(cfg)
        start = start_model(model, mesh)
        tx = make_optimizer(cfg.optim, cfg.steps)
        state = create_state(start.load(), tx, 0, mesh, start.shardings)
        loss = next_token_loss(start.cfg, remat=cfg.remat, chunk=cfg.loss_chunk, aux_coef=1e-3)
        step = make_train_step(loss, tx, lr_fn=lr_schedule(cfg.optim, cfg.steps), mesh=mesh,
                               state_shardings=jax.tree.map(lambda x: x.sharding, state))
        bare = {}
        samples = first_batches(cfg, start)
        for width in sorted({int(r["data/width"]) for r in loop_steps}):
            batch = device_batch(samples[width], mesh)
            state, m = step(state, batch)
            jax.block_until_ready(m)
            times = []
            for _ in range(3):  # BARE_RUN steps back to back (dispatched ahead, as the loop does), 3 times
                t0 = time.perf_counter()
                for _ in range(BARE_RUN):
                    state, m = step(state, batch)
                jax.block_until_ready(m)
                times.append((time.perf_counter() - t0) / BARE_RUN)
            bare[width] = float(np.median(times))
        bare_t = [bare[int(r["data/width"])] for r in loop_steps]
        flops = [model_flops(start.cfg, args.batch, int(r["data/width"])) for r in loop_steps]
        loop_rate, bare_rate = sum(flops) / sum(loop_t), sum(flops) / sum(bare_t)

        # Checkpoint save / restore of the state, and the host memory while restoring.
        state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
        ck = Checkpointer(d / "ck")
        it = iter(lm_dataset(np.zeros((8, 9), np.int32), 4, 0).to_iter_dataset())
        save_s = _timed(lambda: (ck.save(1, state, it, {}), ck.wait()))
        abstract = abstract_state(tx, start.abstract, start.shardings, mesh)
        del state
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            restored = ck.restore(abstract, it)
            jax.block_until_ready(restored[1])
            restore_s = time.perf_counter() - t0
        ck.close()

    print(json.dumps({
        "preset": args.preset, "batch": args.batch, "steps": args.steps, "timed_steps": len(loop_t),
        "loop_flops_per_peak": round(loop_rate / peak, 3), "bare_flops_per_peak": round(bare_rate / peak, 3),
        "loop_over_bare": round(loop_rate / bare_rate, 3), "nonpad_share": round(float(nonpad), 3),
        "nonpad_share_bucketed_2x_batch": round(bucketed_share, 3), "pack_len": args.pack_len,
        "data_s_per_step": round(float(np.median([r["timing_s/data"] for r in loop_steps])), 4),
        "loop_step_s": {int(r["step"]): round(t, 3) for r, t in zip(loop_steps, loop_t)},
        "saved_every": args.save_every, "bare_step_s": {w: round(t, 3) for w, t in bare.items()},
        "state_MiB": round(state_bytes / 2**20, 1), "save_s": round(save_s, 2), "restore_s": round(restore_s, 2),
        "restore_peak_rss_over_state": round((mem.peak - mem.base) / state_bytes, 2),
        "train_s": summary["train_s"],
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
