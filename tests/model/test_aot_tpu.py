"""tools/aot_tpu.py compiles the small preset for a v5e:2x2 TPU topology on this CPU machine (needs libtpu)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "aot_tpu.py"
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


@pytest.mark.slow
@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: pip install -e '.[tpu]' to compile for TPU")
def test_small_preset_compiles_for_v5e_2x2():
    from searchjax.model import load_preset, param_count

    # JAX_PLATFORMS=cpu (set for the whole suite) would hide the TPU compiler: unset it for this process only.
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    cmd = [sys.executable, str(TOOL), "--preset", "small", "--topology", "v5e:2x2", "--mesh", "fsdp=2,tensor=2",
           "--batch", "4", "--seq", "64", "--cache-len", "128", "--json"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
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
