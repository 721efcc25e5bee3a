"""`searchjax train` end to end on the tiny preset: run directory, metrics and event files, HF export, resume after
kill -9 (mid-run and during a save) with the same metrics and bitwise the same final params, and bad input."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.train.conftest import read_metrics

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "train"
# A short LM run: 16 steps of 4 × 64 tokens, a checkpoint every 4 steps.
LM_ARGS = ["steps=16", "batch_size=4", "data.seq_len=64", "save_every=4", "eval_every=8", "log_every=2",
           "progress=false", "checkpoint.async_save=true"]
DETERMINISTIC = ("loss", "nll", "grad_norm", "update_norm", "param_norm", "lr", "router_aux", "data/tokens")


def _cmd(ws, out, *extra, stage="lm"):
    data = ws["corpus"] if stage == "lm" else ws["sft"]
    return [sys.executable, "-m", "searchjax.cli.main", "train", stage, "--config", str(CONFIGS / f"{stage}_tiny.yaml"),
            "--model", str(ws["model"]), "--data", str(data), "--out", str(out), *extra]


def _env():
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=1200, **kw)


def _final_params(run: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(run / "final" / "model.safetensors")


def _read_events(tb: Path) -> set[str]:
    """Scalar tags of the tensorboardX event files (TFRecord framing: length, crc, Event proto, crc)."""
    from tensorboardX.proto import event_pb2

    tags = set()
    for f in tb.glob("events.out.tfevents.*"):
        data = f.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
            pos += 12 + n + 4
            tags |= {v.tag for v in event.summary.value}
    return tags


@pytest.fixture(scope="module")
def reference_run(workspace, tmp_path_factory):
    out = tmp_path_factory.mktemp("lm") / "run"
    r = _run(_cmd(workspace, out, *LM_ARGS))
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_run_directory_metrics_and_events(reference_run):
    run = reference_run
    for name in ("run.json", "config.yaml", "metrics.jsonl", "summary.json", "tb", "checkpoints", "final"):
        assert (run / name).exists(), name
    rows = read_metrics(run)
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps == [2, 4, 6, 8, 10, 12, 14, 16]
    assert all(k in rows[-1] or k in rows[-2] for k in ("loss", "lr", "grad_norm", "perf/tokens_per_s",
                                                           "perf/step_time_s", "perf/mfu", "data/nonpad_frac"))
    assert any("dev/loss" in r for r in rows)
    tags = _read_events(run / "tb")
    assert {"loss", "lr", "grad_norm", "perf/tokens_per_s", "perf/mfu", "dev/loss"} <= tags, tags
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses[-1] < losses[0]


def test_final_export_loads_in_transformers(reference_run):
    import torch
    from transformers import Qwen3_5MoeForCausalLM

    from searchjax.model import forward, load_hf

    cfg, params = load_hf(reference_run / "final")
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 12)).astype(np.int32)
    ours = np.asarray(forward(params, tokens, cfg))
    model = Qwen3_5MoeForCausalLM.from_pretrained(reference_run / "final", dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
    assert (reference_run / "final" / "tokenizer.json").exists()


def _kill_when(proc: subprocess.Popen, ready, timeout_s: float = 300.0) -> None:
    t0 = time.monotonic()
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (rc {proc.returncode}) before the kill point: "
                                 f"{proc.stderr.read()[-2000:]}")
        if time.monotonic() - t0 > timeout_s:
            proc.kill()
            raise AssertionError("kill point not reached in time")
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _committed(run: Path, step: int) -> bool:
    return (run / "checkpoints" / str(step) / "meta").exists()


def _saving(run: Path) -> bool:
    ck = run / "checkpoints"
    return ck.exists() and any("tmp" in p.name for p in ck.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("when", ["mid_run", "during_save"])
def test_kill_9_then_resume_matches_uninterrupted(workspace, reference_run, tmp_path, when):
    out = tmp_path / "run"
    proc = subprocess.Popen(_cmd(workspace, out, *LM_ARGS), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=_env())
    if when == "mid_run":
        _kill_when(proc, lambda: _committed(out, 8))
    else:
        _kill_when(proc, lambda: _committed(out, 4) and _saving(out))
    assert not (out / "final").exists()
    r = _run(_cmd(workspace, out, *LM_ARGS))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming" in r.stdout
    ref = {row["step"]: row for row in read_metrics(reference_run)}
    got = {row["step"]: row for row in read_metrics(out)}
    assert sorted(got) == sorted(ref)
    for step, row in ref.items():
        for key in DETERMINISTIC:
            if key in row:
                assert got[step][key] == row[key], (step, key)
    a, b = _final_params(reference_run), _final_params(out)
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_second_start_resumes_and_overwrite_restarts(workspace, tmp_path):
    out = tmp_path / "run"
    args = ["steps=2", "batch_size=2", "data.seq_len=32", "progress=false", "eval_every=0"]
    assert _run(_cmd(workspace, out, *args)).returncode == 0
    r = _run(_cmd(workspace, out, *args))
    assert r.returncode == 0 and "resuming" in r.stdout and '"resumed_from": 2' in r.stdout
    r = _run(_cmd(workspace, out, *args, "seed=1"))
    assert r.returncode == 1 and "differs" in r.stderr and "seed" in r.stderr
    r = _run(_cmd(workspace, out, "--overwrite", *args, "seed=1"))
    assert r.returncode == 0 and '"resumed_from": 0' in r.stdout


@pytest.mark.parametrize("extra, message", [
    (["optim.lr=1"], "unknown key 'lr' in optim; valid keys are"),
    (["stepz=3"], "unknown key 'stepz'"),
    (["steps=abc"], "expected int"),
    (["data"], "expected key.sub=value"),
])
def test_bad_overrides_fail_before_anything_is_written(workspace, tmp_path, extra, message):
    out = tmp_path / "run"
    r = _run(_cmd(workspace, out, *extra))
    assert r.returncode == 1, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_bad_config_missing_data_and_foreign_dir(workspace, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: 3\noptim:\n  learning_rat: 0.1\n")
    cmd = _cmd(workspace, tmp_path / "a")
    cmd[cmd.index("--config") + 1] = str(bad)
    r = _run(cmd)
    assert r.returncode == 1 and "learning_rat" in r.stderr and "bad.yaml" in r.stderr, r.stderr
    cmd = _cmd(workspace, tmp_path / "b")
    cmd[cmd.index("--data") + 1] = str(tmp_path / "nope.jsonl")
    r = _run(cmd)
    assert r.returncode == 1 and "nope.jsonl" in r.stderr and "Traceback" not in r.stderr, r.stderr
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    r = _run(_cmd(workspace, foreign, "steps=1"))
    assert r.returncode == 1 and "not a searchjax run directory" in r.stderr, r.stderr
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_sft_stage_end_to_end(workspace, tmp_path):
    out = tmp_path / "sft"
    # The workspace's 1,024-id BPE renders the system turn with the tool schema in ~1,030 tokens, so a search
    # trajectory (every dev row) needs max_len 2048 to keep any assistant token.
    r = _run(_cmd(workspace, out, "steps=4", "batch_size=4", "data.max_len=2048", "data.buckets=[1024,2048]",
                  "data.window_batches=2", "eval_every=4", "data.eval_batches=1", "log_every=1", stage="sft"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "evaluation skipped" not in r.stdout
    rows = read_metrics(out)
    train = [row for row in rows if "loss" in row]
    assert [row["step"] for row in train] == [1, 2, 3, 4]
    assert all(row["data/width"] in (1024, 2048) for row in train)
    assert all(0 < row["data/loss_tokens"] < row["data/tokens"] for row in train)
    assert any("dev/loss" in row for row in rows)
    assert (out / "final" / "model.safetensors").exists()


def test_export_a_checkpoint(reference_run, tmp_path):
    base = [sys.executable, "-m", "searchjax.cli.main", "train", "export", "--run", str(reference_run)]
    r = _run([*base, "--out", str(tmp_path / "last")])
    assert r.returncode == 0 and "exported step 16" in r.stdout, r.stderr[-2000:]
    last = _final_params(reference_run)
    from safetensors.numpy import load_file

    got = load_file(tmp_path / "last" / "model.safetensors")
    assert all(np.array_equal(got[k], last[k]) for k in last)
    r = _run([*base, "--step", "12", "--out", str(tmp_path / "mid")])  # keep: 2 holds steps 12 and 16
    assert r.returncode == 0, r.stderr[-2000:]
    mid = load_file(tmp_path / "mid" / "model.safetensors")
    assert any(not np.array_equal(mid[k], last[k]) for k in last)
    assert (tmp_path / "mid" / "tokenizer.json").exists()
    r = _run([*base, "--step", "7", "--out", str(tmp_path / "none")])
    assert r.returncode == 1 and "saved steps" in r.stderr and not (tmp_path / "none").exists()


def test_sft_stage_with_packed_rows(workspace, tmp_path):
    """data.pack_len: one row width for the whole run, several examples a row, segments reaching the loss."""
    out = tmp_path / "sft_packed"
    r = _run(_cmd(workspace, out, "steps=3", "batch_size=2", "data.max_len=2048", "data.pack_len=4096",
                  "data.pack_bins=4", "eval_every=0", "log_every=1", stage="sft"))
    assert r.returncode == 0, r.stderr[-3000:]
    train = [row for row in read_metrics(out) if "loss" in row]
    assert [row["step"] for row in train] == [1, 2, 3]
    assert all(row["data/width"] == 4096 and row["data/rows"] == 2 for row in train)
    assert all(row["data/tokens"] > 4096 for row in train)  # more than one ~1,100-token example per row
    assert (out / "final" / "model.safetensors").exists()
