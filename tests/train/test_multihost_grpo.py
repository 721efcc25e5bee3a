"""GRPO over 2 CPU processes (loopback, `jax.distributed`) ≡ 1 process with the same global batch: the same
rollouts on every process, the same per-step metrics, and a checkpoint that restores in one process.

Across CPU processes the train step runs its loss per batch shard (`searchjax.train.step.shards_explicitly`):
partitioned over a sharded batch, the model's control flow (the MoE block scheme's `lax.cond` and `fori_loop`s,
the vocabulary scan of log π) holds collectives, which XLA:CPU starts out of order across processes (a gloo
"collective mismatch" abort in the first train step). The first test checks the compiled step on 2 fake
devices; the second runs GRPO on 2 processes. A shard is combined as a micro-batch is, so the 1-process run
it is compared with has 2 micro-batches (the same rows in the same groups); loss and gradient are the same
either way, the per-token means (entropy, kl, canary) and the router's balance loss are per group.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.train.conftest import read_metrics
from tests.train.test_grpo import CONFIG, _cmd, _env, rl_workspace  # noqa: F401 (rl_workspace is a fixture)

# 4 rollouts a batch, 2 optimizer steps on it (PPO clip: log π_old per shard too), 1 row per process and step.
ARGS = ["steps=2", "batch_size=2", "rollout.group_size=2", "rollout.slots=4", "rollout.max_new_tokens=32",
        "rollout.temperature=0.7", "minibatches=2", "rewards.clip_eps=0.2", "save_every=1",
        "checkpoint.async_save=false", "progress=false"]
# Computed from the rollouts' tokens alone, which must be equal token for token.
ROLLOUT = ("reward/score/mean", "reward/score/std", "reward/base", "reward/preference", "penalty/tool",
           "penalty/length", "penalty/eff", "advantages/mean", "advantages/std", "response_length", "ref_length",
           "tool_calls", "failed_calls", "finish_reason/answer", "finish_reason/max_tokens", "data/width",
           "data/tokens", "data/loss_tokens", "weights/version", "reference/new_prompts")
COLLECTIVE = re.compile(r"\b(all-gather|all-reduce|all-to-all|reduce-scatter|collective-permute)(-start)?\(")
NESTED = re.compile(r"(?:branch_computations=\{([^}]*)\}|\b(?:body|condition)=%([\w.\-]+))")


def collectives_in_control_flow(hlo: str) -> int:
    """How many collectives of an optimized HLO module sit in a computation that a conditional or while calls
    (directly or through another such computation)."""
    comps: dict[str, list[str]] = {}
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%(\S+) .*\{$", line)
        if head:
            comps[head.group(1)] = body = []
        elif comps:
            body.append(line)
    inside, todo = set(), list(comps)
    while todo:
        for branches, loop in NESTED.findall("\n".join(comps[todo.pop()])):
            for name in [b.strip().lstrip("%") for b in branches.split(",") if b.strip()] + [loop]:
                if name in comps and name not in inside:
                    inside.add(name)
                    todo.append(name)
    return sum(bool(COLLECTIVE.search(line)) for name in inside for line in comps[name])


def _step_setup(devices: int, micro_batches: int, explicit_shards: bool):
    """(state, step, batch) of the GRPO loss on a 2-layer tiny model over `devices` fake devices (fsdp)."""
    from searchjax.model import init_params, load_preset, param_shardings
    from searchjax.rewards.config import RewardConfig
    from searchjax.sharding import make_mesh
    from searchjax.train.config import OptimConfig
    from searchjax.train.optim import make_optimizer
    from searchjax.train.rl import grpo_loss_fn
    from searchjax.train.state import create_state
    from searchjax.train.step import device_batch, make_train_step

    cfg = load_preset("tiny").replace(num_hidden_layers=2, layer_types=("linear_attention", "full_attention"))
    mesh = make_mesh({"fsdp": devices}, devices=jax.devices()[:devices])
    shardings = param_shardings(cfg, mesh)
    tx = make_optimizer(OptimConfig(learning_rate=1e-3, warmup_steps=0, schedule="constant"), 10)
    state = create_state(jax.device_put(init_params(cfg, jax.random.key(0)), shardings), tx, 0, mesh, shardings)
    # chunk 64 < V = 256: log π scans the vocabulary, the fsdp-sharded unembedding inside the loop.
    loss = grpo_loss_fn(cfg, RewardConfig(), temperature=0.7, chunk=64, aux_coef=cfg.router_aux_loss_coef)
    step = make_train_step(loss, tx, micro_batches=micro_batches, mesh=mesh, explicit_shards=explicit_shards,
                           state_shardings=jax.tree.map(lambda x: x.sharding, state))
    rng = np.random.default_rng(0)
    rows, width = 8, 32
    ids = rng.integers(3, cfg.vocab_size, (rows, width)).astype(np.int32)
    mask = (np.arange(width)[None] >= rng.integers(4, 24, (rows, 1))).astype(np.int32)
    batch = {"input_ids": ids, "targets": np.roll(ids, -1, 1), "loss_mask": mask,
             "logp_infer": (rng.normal(-5.0, 0.1, (rows, width)) * mask).astype(np.float32),
             "advantages": rng.normal(size=rows).astype(np.float32),
             "lengths": rng.integers(24, width + 1, rows).astype(np.int32)}
    return state, step, device_batch(batch, mesh)


@pytest.mark.slow
def test_per_shard_step_has_no_collective_in_control_flow_and_equals_micro_batches():
    """Partitioned over a sharded batch, the step holds collectives inside control flow (the MoE block scheme's
    cond and loops, the vocabulary scan of log π): what XLA:CPU starts out of order across processes. Per shard
    it holds none, and 2 shards equal 1 device with 2 micro-batches (the same rows in the same groups)."""
    state, step, batch = _step_setup(2, 1, explicit_shards=False)
    assert collectives_in_control_flow(step.lower(state, batch).compile().as_text()) > 0
    runs = []
    for devices, micro, explicit in ((2, 1, True), (1, 2, False)):
        state, step, batch = _step_setup(devices, micro, explicit)
        if explicit:
            step = step.lower(state, batch).compile()
            assert collectives_in_control_flow(step.as_text()) == 0
        metrics = []
        for _ in range(2):
            state, m = step(state, batch)
            metrics.append({k: float(v) for k, v in m.items()})
        runs.append((metrics, jax.tree.map(np.asarray, state.params)))
    (two, p2), (one, p1) = runs
    for a, b in zip(one, two):
        for key in a:
            np.testing.assert_allclose(b[key], a[key], rtol=1e-6, atol=1e-7, err_msg=key)
    # Adam's g/√v turns the rounding noise of a near-zero gradient entry into a visible share of an lr step.
    for x, y in zip(jax.tree.leaves(p2), jax.tree.leaves(p1)):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5)


def _restore_and_compare(run: Path, overrides: list[str]) -> None:
    """RUN's last checkpoint, restored in this one process, equals RUN/final."""
    from searchjax.model import load_hf, param_shardings
    from searchjax.sharding import make_mesh
    from searchjax.train.checkpoint import Checkpointer
    from searchjax.train.config import load_train_config
    from searchjax.train.grpo import GRPOConfig
    from searchjax.train.optim import make_optimizer
    from searchjax.train.state import abstract_state

    cfg = load_train_config(GRPOConfig, CONFIG, overrides)
    model_cfg, final = load_hf(run / "final")
    mesh = make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
    tx = make_optimizer(cfg.optim, cfg.steps * cfg.minibatches)
    abstract = abstract_state(tx, jax.eval_shape(lambda: final), param_shardings(model_cfg, mesh), mesh)
    ck = Checkpointer(run / "checkpoints")
    state = ck.restore_state(cfg.steps, abstract)
    ck.close()
    assert int(state.step) == cfg.steps * cfg.minibatches  # optimizer steps; the checkpoint counts rollout batches
    for x, y in zip(jax.tree.leaves(state.params), jax.tree.leaves(final)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _summary(stdout: str) -> dict:
    return json.loads(stdout[stdout.index("{\n"):])


@pytest.mark.slow
def test_two_processes_match_one(rl_workspace, tmp_path):  # noqa: F811
    import portpicker

    # Two prompts and batch_size 2: step 2 rolls out the same prompts with the updated (synced) weights, and its
    # reference rollouts come from the cache.
    rows = [json.loads(line) for line in Path(rl_workspace["qa"]).read_text().splitlines() if line.strip()]
    prompts = tmp_path / "prompts.jsonl"
    train = [r for r in rows if r.get("split", "train") == "train"][:2]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in train))
    ws = {**rl_workspace, "qa": prompts}
    port = portpicker.pick_unused_port()
    dist = ["distributed.num_processes=2", f"distributed.coordinator_address=127.0.0.1:{port}"]
    # The 1-process run goes alongside the 2-process one (the CI machine has 2 cores; each run alone leaves one
    # mostly idle while it compiles).
    procs = [subprocess.Popen(_cmd(ws, tmp_path / "one", *ARGS, "optim.micro_batches=2"), env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    procs += [subprocess.Popen(_cmd(ws, tmp_path / "two", *ARGS, *dist, f"distributed.process_id={i}"), env=_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=1500) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]

    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2]
    assert two[1]["reference/new_prompts"] == 0 and two[1]["weights/version"] == 2
    for a, b in zip(one, two):
        for key in ROLLOUT:
            assert b[key] == a[key], (a["step"], key, b[key], a[key])
        # Trainer figures: the 2-process step adds the shards' sums where the 1-process one adds its micro-batches'
        # in a scan, so float32 rounding differs (measured: ≤ 1e-7 relative; the on-policy pg_loss and kl, ~1e-4,
        # by ~1e-8), and from step 2 on the weights differ by that rounding. The canary is the gap between two
        # computations of the same log-probs, one float32 ulp (4.8e-7 near 7) either way: 1e-6 absolute.
        for key in sorted(set(a) - set(ROLLOUT)):
            if not key.startswith(("timing_s/", "perf/")):
                atol = 1e-6 if key.startswith("canary/") else 1e-7
                np.testing.assert_allclose(b[key], a[key], rtol=1e-6, atol=atol, err_msg=f"step {a['step']} {key}")
        assert b["canary/logp_abs_diff_max"] <= 1e-4
    # Both processes computed the same figures (process 0 alone writes metrics.jsonl).
    last = [{k: v for k, v in _summary(out)["last_metrics"].items() if not k.startswith(("timing_s/", "perf/"))}
            for out, _ in outs[1:]]
    assert last[0] == last[1]
    _restore_and_compare(tmp_path / "two", ARGS)
