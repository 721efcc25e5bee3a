"""Two CPU processes over loopback form one 4-device mesh; the sharded forward gives the single-process logits.

The test starts this file twice as a script (`--worker`), each process with 2 fake CPU devices, joined through
`searchjax.distributed.maybe_initialize`. Process 0 writes the gathered logits to a file that the test compares
with the forward computed here in one process.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SEQ_SHAPE = (4, 16)
WORKER_TIMEOUT_S = 600


def _tokens(vocab_size: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, vocab_size, SEQ_SHAPE).astype(np.int32)


def _worker(process_id: int, port: int, out: Path) -> None:
    """One process of the run: join, build the sharded tiny model, run forward, gather, write (process 0)."""
    import jax
    from jax.experimental import multihost_utils

    from searchjax.distributed import maybe_initialize
    from searchjax.model import forward, init_params, load_preset
    from searchjax.sharding import make_mesh

    assert maybe_initialize(2, process_id, f"127.0.0.1:{port}", initialization_timeout_s=300)
    assert jax.process_count() == 2 and len(jax.devices()) == 4 and len(jax.local_devices()) == 2
    cfg = load_preset("tiny")
    mesh = make_mesh({"fsdp": 2, "tensor": 2})
    params = init_params(cfg, jax.random.key(0), mesh=mesh)
    assert not params.embed.is_fully_addressable  # really spread over both processes
    logits = multihost_utils.process_allgather(forward(params, _tokens(cfg.vocab_size), cfg), tiled=True)
    if process_id == 0:
        np.save(out, np.asarray(logits))
    jax.distributed.shutdown()


def _spawn(process_id: int, port: int, out: Path, log: Path) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    cmd = [sys.executable, __file__, "--worker", str(process_id), str(port), str(out)]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_two_processes_match_single_process(tmp_path):
    import jax
    import portpicker

    from searchjax.model import forward, init_params, load_preset

    port = portpicker.pick_unused_port()
    out = tmp_path / "logits.npy"
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    procs = [_spawn(i, port, out, logs[i]) for i in range(2)]
    try:
        cfg = load_preset("tiny")
        ref = np.asarray(forward(init_params(cfg, jax.random.key(0)), _tokens(cfg.vocab_size), cfg))
        codes = [p.wait(timeout=WORKER_TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0, 0], "\n".join(f"--- worker {i}:\n{log.read_text()[-3000:]}" for i, log in enumerate(logs))
    np.testing.assert_allclose(np.load(out), ref, rtol=1e-5, atol=1e-5)


def test_maybe_initialize_single_process_is_a_no_op():
    from searchjax.distributed import maybe_initialize

    assert maybe_initialize(1, 0, None) is False


@pytest.mark.parametrize(
    "args,match",
    [
        ((0, 0, None), "num_processes must be >= 1"),
        ((2, 2, "127.0.0.1:1234"), "process_id must be in \\[0, 2\\)"),
        ((2, 0, None), "coordinator_address must be 'host:port'"),
        ((2, 1, "localhost"), "coordinator_address must be 'host:port'"),
    ],
)
def test_bad_distributed_config_raises(args, match):
    from searchjax.distributed import maybe_initialize

    with pytest.raises(ValueError, match=match):
        maybe_initialize(*args)


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
