"""`searchjax model init|info` and `searchjax demo`."""

import json

import numpy as np
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from searchjax.cli.main import main
from searchjax.model import load_hf, param_count


def test_model_init_with_vocab_size_then_info(tmp_path, capsys):
    out = tmp_path / "ck"
    assert main(["model", "init", "--preset", "tiny", "--seed", "3", "--vocab-size", "300", "--out", str(out)]) == 0
    cfg, params = load_hf(out)
    assert cfg.vocab_size == 300 and params.embed.shape == (300, 64)
    assert "wrote tiny (vocab 300" in capsys.readouterr().out
    assert main(["model", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["params_total"] == param_count(cfg) == param_count(params)
    assert 0 < info["params_active"] < info["params_total"]
    assert info["cache_bytes_per_token"]["bfloat16"] == 2 * 2 * 32 * 2  # 1 full layer × (k+v) × 2 heads × 32 × 2 B
    assert main(["model", "info", str(out)]) == 0
    assert "active per token" in capsys.readouterr().out


def test_model_init_follows_tokenizer_and_copies_it(tmp_path):
    vocab = {f"w{i}": i for i in range(77)}
    tok_file = tmp_path / "tokenizer.json"
    Tokenizer(WordLevel(vocab, unk_token="w0")).save(str(tok_file))
    out = tmp_path / "ck"
    assert main(["model", "init", "--preset", "tiny", "--seed", "0", "--tokenizer", str(tok_file),
                 "--out", str(out)]) == 0
    assert load_hf(out)[0].vocab_size == 77
    assert (out / "tokenizer.json").read_text() == tok_file.read_text()
    # Same seed, same weights.
    again = tmp_path / "again"
    main(["model", "init", "--preset", "tiny", "--seed", "0", "--vocab-size", "77", "--out", str(again)])
    np.testing.assert_array_equal(load_hf(out)[1].embed, load_hf(again)[1].embed)


def test_cli_errors(tmp_path, capsys):
    assert main(["model", "info", str(tmp_path)]) == 1
    assert "no config.json" in capsys.readouterr().err
    assert main(["model", "init", "--preset", "nope", "--vocab-size", "10", "--out", str(tmp_path / "x")]) == 1
    assert "unknown model preset 'nope'" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["model", "init", "--preset", "tiny", "--tokenizer", str(bad), "--out", str(tmp_path / "y")]) == 1
    assert "cannot read tokenizer" in capsys.readouterr().err


def test_demo_runs_the_pipeline_end_to_end(tmp_path, capsys):
    out_dir = tmp_path / "demo"
    args = ["demo", "--out", str(out_dir), "--docs", "1500", "--questions", "2", "--group", "2",
            "--max-new-tokens", "8", "--slots", "4", "--max-len", "2048"]
    assert main(args) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "compiling the engine's kernels" in captured.err
    for stage in ("[1 world]", "[2 index]", "[3 tokenizer]", "[4 data]", "[5 model]", "[6 rollouts]", "[7 rewards]"):
        assert stage in out
    assert "saved and reloaded in HF format" in out and "greedy decode: batch 4" in out and "tokens/s" in out
    from searchjax.rollout import read_jsonl

    records = read_jsonl(out_dir / "rollouts.jsonl")
    questions = (out_dir / "qa.jsonl").read_text().splitlines()
    assert len(records) == len(questions) * (2 + 1)  # G policy rollouts + 1 reference per question
    assert all(r.response_length <= 8 for r in records)
    # The printed figures are saved, each artefact is described, the tokenizer is stored once (with the model).
    summary = json.loads((out_dir / "summary.json").read_text())
    assert {"world", "index", "tokenizer", "data", "model", "rollouts", "rewards"} <= set(summary)
    assert summary["rollouts"]["compile_s"] > 0 and summary["rollouts"]["tokens_per_s"] > 0
    readme = (out_dir / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in ("world/corpus.jsonl", "index/", "model/", "rollouts.jsonl"))
    assert not (out_dir / "tokenizer.json").exists() and (out_dir / "model" / "tokenizer.json").exists()
    # A second run into the same directory refuses to clobber it unless told to; nothing beside it is left.
    assert main(args) == 1
    assert "exists (pass --overwrite to replace it)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]
