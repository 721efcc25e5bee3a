"""`searchjax model init|info`: corrupt checkpoints named by file, outputs replaced whole, file modes."""

import json
import os
import shutil

from searchjax.model import load_hf


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_truncated_safetensors_is_named(tiny_model, tmp_path, fails):
    ck = _copy(tiny_model, tmp_path / "ck")
    weights = ck / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    line = fails("model.safetensors: not a readable safetensors file", "model", "info", ck)
    assert str(weights) in line
    weights.write_bytes(b"\x05")
    fails(str(weights), "model", "info", ck)


def test_truncated_safetensors_from_load_hf(tiny_model, tmp_path):
    import pytest

    from searchjax.model import CheckpointError

    ck = _copy(tiny_model, tmp_path / "ck")
    weights = ck / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file"):
        load_hf(ck)


def test_corrupt_config_json_is_named(tiny_model, tmp_path, fails):
    ck = _copy(tiny_model, tmp_path / "ck")
    config = ck / "config.json"
    config.write_text(config.read_text()[:40])
    fails(f"{config}: not valid JSON", "model", "info", ck)
    config.write_text("[1, 2]")
    fails(f"{config}: expected a JSON object, got list", "model", "info", ck)
    config.write_text(json.dumps({"model_type": "qwen3_5_moe_text", "hidden_act": "gelu"}))
    fails(f"{config}: ", "model", "info", ck)


def test_init_refuses_an_existing_output_and_replaces_it_whole_with_overwrite(tmp_path, cli, fails):
    out = tmp_path / "model"
    out.mkdir()
    (out / "tokenizer.json").write_text("{}")  # a stale file from an earlier run
    fails("exists (pass --overwrite", "model", "init", "--preset", "tiny", "--vocab-size", "300", "--out", out)
    code, _, err = cli("model", "init", "--preset", "tiny", "--vocab-size", "300", "--out", out, "--overwrite")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_init_checks_outputs_and_inputs_before_work(tmp_path, fails):
    fails("does not exist", "model", "init", "--preset", "tiny", "--vocab-size", "300", "--out", tmp_path / "a" / "b")
    (tmp_path / "f").write_text("")
    fails("is a file, expected a directory", "model", "init", "--preset", "tiny", "--vocab-size", "300",
          "--out", tmp_path / "f", "--overwrite")
    fails("--tokenizer", "model", "init", "--preset", "tiny", "--tokenizer", tmp_path / "none.json",
          "--out", tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_safetensors_mode_follows_umask(tmp_path, cli):
    old = os.umask(0o022)
    try:
        code, _, err = cli("model", "init", "--preset", "tiny", "--vocab-size", "300", "--out", tmp_path / "m")
    finally:
        os.umask(old)
    assert code == 0, err
    assert (tmp_path / "m" / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "m").stat().st_mode & 0o777 == 0o755


def test_vocab_size_must_be_positive(tmp_path, cli):
    code, _, err = cli("model", "init", "--preset", "tiny", "--vocab-size", "0", "--out", tmp_path / "m")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--vocab-size" in err
