"""tools/expert_ceiling.py: the search-only expert's held-out accuracy by hops, on a tiny world."""

import importlib.util
import json
from pathlib import Path

from searchjax.testing.workspace import tiny_data

_PATH = Path(__file__).resolve().parents[2] / "tools" / "expert_ceiling.py"
_spec = importlib.util.spec_from_file_location("expert_ceiling", _PATH)
expert_ceiling = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(expert_ceiling)


def test_ceiling_counts_every_question_and_grows_with_results(tmp_path, capsys):
    rows = tiny_data(tmp_path, questions=24, dev_fraction=0.5)
    dev = [r for r in rows if r["split"] == "dev" and not r.get("augmented")]
    assert expert_ceiling.main(["--index", str(tmp_path / "index"), "--qa", str(tmp_path / "qa.jsonl"),
                                "--results", "1", "10", "--tokenizer", str(tmp_path / "tokenizer.json")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["questions"] == len(dev) > 0
    one, ten = report["results_1"], report["results_10"]
    for r in (one, ten):
        assert sum(n for _, n in r["by_hops"].values()) == len(dev)
        assert r["tool_tokens_per_call_median"] > 0
    # Every question was verified by the search solver with 10 results when it was generated.
    assert sum(k for k, _ in ten["by_hops"].values()) == len(dev)
    assert sum(k for k, _ in one["by_hops"].values()) <= len(dev)
    assert one["tool_tokens_per_call_median"] < ten["tool_tokens_per_call_median"]
