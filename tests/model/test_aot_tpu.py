"""tools/aot_tpu.py compiles the small preset for a v5e:2x2 TPU topology on this CPU machine.

The tool needs libtpu, which is kept out of the main environment (it slows every plain `import jax` there): it
runs under the interpreter of SEARCHJAX_TPU_PYTHON (set by `make test`), else .venv-tpu/bin/python (`make
tpu-env`), else this interpreter if it has libtpu.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "aot_tpu.py"


def tpu_python() -> str:
    """The interpreter with libtpu (see the module docstring); fails, saying how to make one, when there is none."""
    candidates = [os.environ.get("SEARCHJAX_TPU_PYTHON"), str(ROOT / ".venv-tpu" / "bin" / "python")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    if importlib.util.find_spec("libtpu") is not None:
        return sys.executable
    pytest.fail("no interpreter with libtpu: run `make tpu-env` (make test does) or set SEARCHJAX_TPU_PYTHON")


@pytest.mark.slow
def test_small_preset_compiles_for_v5e_2x2():
    from searchjax.model import load_preset, param_count

    # JAX_PLATFORMS=cpu (set for the whole suite) would hide the TPU compiler: unset it for this process only.
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    cmd = [tpu_python(), str(TOOL), "--preset", "small", "--topology", "v5e:2x2", "--mesh", "fsdp=2,tensor=2",
           "--batch", "4", "--seq", "64", "--cache-len", "128", "--json"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["step"] for r in reports] == ["prefill", "decode_step"]
    param_bytes = 2 * param_count(load_preset("small"))  # bfloat16
    for r in reports:
        assert r["fits"] and r["hbm_bytes"] == 16 * 2**30  # v5e: 16 GiB per chip
        # Params are split at most 4 ways (fsdp×tensor) and at least partly: between a quarter and all of them.
        assert param_bytes / 4 <= r["arguments_bytes"] < param_bytes
        assert r["flops_per_chip"] > 0
    # Prefill of 4×64 tokens does far more work than one decode token per row.
    assert reports[0]["flops_per_chip"] > 20 * reports[1]["flops_per_chip"]


def test_parse_mesh():
    sys.path.insert(0, str(TOOL.parent))
    try:
        from aot_tpu import parse_mesh
    finally:
        sys.path.remove(str(TOOL.parent))
    assert parse_mesh("data=1,fsdp=8,tensor=4,expert=4") == {"data": 1, "fsdp": 8, "tensor": 4, "expert": 4}
    with pytest.raises(ValueError, match="expected name=int pairs"):
        parse_mesh("fsdp:8")


def test_the_main_environment_has_no_libtpu_when_a_tpu_environment_exists():
    """Where the Makefile made .venv-tpu, libtpu lives there only: a plain `import jax` here stays fast."""
    python = tpu_python()
    if python == sys.executable:
        pytest.fail("libtpu is in the test environment itself; `make test` keeps it in .venv-tpu")
    assert importlib.util.find_spec("libtpu") is None, "libtpu is installed in the main environment"
    probe = subprocess.run([python, "-c", "import libtpu, searchjax; print(libtpu.__file__)"], capture_output=True,
                           text=True, timeout=300)
    assert probe.returncode == 0 and str(Path(python).parents[1]) in probe.stdout, probe.stderr
