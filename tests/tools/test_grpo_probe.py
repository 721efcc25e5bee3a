"""tools/grpo_probe.py: the trend of a fixed probe set's r_base over checkpoints, its bootstrap interval over
prompts, and the first-vs-last pairing (the end-to-end run on a tiny GRPO run is in tests/train/test_grpo.py)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "tools" / "grpo_probe.py"
_spec = importlib.util.spec_from_file_location("grpo_probe", _PATH)
grpo_probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grpo_probe)

STEPS = np.array([0, 8, 16, 24, 32, 40])


def test_a_rising_success_rate_is_found_with_an_interval_around_it():
    rng = np.random.default_rng(0)
    p = 0.2 + 0.0075 * STEPS  # 0.20 → 0.50 over 40 steps: slope 0.0075 per step
    outcomes = (rng.random((600, STEPS.size)) < p).astype(float)
    out = grpo_probe.trend(STEPS, outcomes)
    assert out["trend"] == "rises" and out["lo"] > 0
    assert out["lo"] < 0.0075 < out["hi"]
    assert out["slope"] == pytest.approx(0.0075, abs=0.0015)


def test_a_constant_policy_is_flat_and_persistent_prompts_give_a_zero_width_interval():
    rng = np.random.default_rng(1)
    noisy = (rng.random((300, STEPS.size)) < 0.3).astype(float)
    out = grpo_probe.trend(STEPS, noisy)
    assert out["lo"] < 0 < out["hi"] and out["trend"].startswith("flat")
    # Each prompt right or wrong at every step: nothing moves, whatever the resample.
    fixed = np.repeat((rng.random((50, 1)) < 0.4).astype(float), STEPS.size, axis=1)
    out = grpo_probe.trend(STEPS, fixed)
    assert out["slope"] == 0 and out["lo"] == 0 and out["hi"] == 0


def test_one_prompt_that_flips_is_not_evidence_of_a_trend():
    """The bootstrap keeps a prompt's outcomes together: a single prompt going wrong → right moves the mean, but
    resamples without it are as likely, so the interval reaches 0."""
    outcomes = np.zeros((40, STEPS.size))
    outcomes[0, 3:] = 1.0
    out = grpo_probe.trend(STEPS, outcomes)
    assert out["slope"] > 0 and out["lo"] <= 0 < out["hi"]


def test_first_vs_last_counts_and_mcnemar():
    outcomes = np.array([[0, 1, 1], [0, 0, 1], [1, 1, 0], [1, 0, 1], [0, 0, 0]], float)
    out = grpo_probe.first_vs_last(outcomes)
    assert (out["gained"], out["lost"]) == (2, 1)
    assert out["mcnemar_p"] == pytest.approx(1.0)  # 3 discordant, 2 vs 1: two-sided exact p = 1


def test_first_vs_last_with_sampled_outcomes_counts_prompts_whose_mean_moved():
    outcomes = np.array([[0.25, 0.75], [0.5, 0.5], [1.0, 0.75], [0.0, 0.25]])
    out = grpo_probe.first_vs_last(outcomes)
    assert (out["gained"], out["lost"]) == (2, 1) and out["mcnemar_p"] == pytest.approx(1.0)


def test_more_than_one_greedy_sample_is_refused_before_any_work(capsys):
    with pytest.raises(SystemExit):
        grpo_probe.main(["--run", "nowhere", "--index", "nowhere", "--steps", "0", "4", "--samples", "3"])
    assert "--samples 3" in capsys.readouterr().err


@pytest.mark.parametrize("shape", [(5,), (5, 3), (0, 6)])
def test_trend_refuses_outcomes_that_do_not_match_the_steps(shape):
    with pytest.raises(ValueError, match="outcomes"):
        grpo_probe.trend(STEPS, np.zeros(shape))


def _report(acc, hops, calls, temperature=0.0):
    return {"accuracy": {str(s): a for s, a in acc.items()}, "temperature": temperature, "samples": 1,
            "accuracy_by_hops": {str(s): h for s, h in hops.items()},
            "mean_tool_calls": {str(s): c for s, c in calls.items()}}


def test_replot_draws_saved_reports_without_a_run(tmp_path):
    a = _report({0: 0.4, 8: 0.5}, {0: {"2": [3, 5], "3": [1, 5]}, 8: {"2": [4, 5], "3": [1, 5]}}, {0: 2.5, 8: 2.1})
    b = _report({0: 0.4, 40: 0.3}, {0: {"2": [3, 5], "3": [1, 5]}, 40: {"2": [3, 5]}}, {0: 2.5, 40: 2.0})
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    png = tmp_path / "probes.png"
    argv = ["--replot", f"A, T=0={tmp_path / 'a.json'}", str(tmp_path / "b.json"), "--png", str(png)]
    assert grpo_probe.main(argv) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, message", [
    (["--replot", "a.json"], "--replot needs --png"),
    (["--replot", "T=1=missing.json", "--png", "x.png"], "--replot T=1=missing.json: no report file missing.json"),
    (["--run", "RUN", "--steps", "0", "4"], "--index required"),
    (["--run", "RUN", "--index", "I", "--steps", "4"], "at least two distinct steps"),
])
def test_bad_arguments_are_refused_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit):
        grpo_probe.main(argv)
    assert message in capsys.readouterr().err


def test_probe_prompts_are_a_seeded_draw_of_the_runs_qa_training_pool(tmp_path):
    from searchjax.train.config import load_train_config
    from searchjax.train.grpo import GRPOConfig, with_prompts

    config = Path(__file__).resolve().parents[2] / "configs" / "train" / "grpo_tiny.yaml"
    qa, rub = tmp_path / "qa.jsonl", tmp_path / "rub.jsonl"
    rows = [{"id": f"q{i}", "question": f"Q{i}?", "answer": "A", "hops": 2 + i % 3, "split": "train"}
            for i in range(30)]
    rows += [{"id": "dev", "question": "D?", "answer": "A", "hops": 2, "split": "dev"}]
    qa.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rub.write_text(json.dumps({"id": "r0", "messages": [{"role": "user", "content": "Say hello."}],
                               "reference": "Hello!",
                               "rubrics": [{"text": "says hello", "kind": "contains", "params": {"all": ["hello"]}}]})
                   + "\n")
    cfg = with_prompts(load_train_config(GRPOConfig, config, ["data.qa_hops=[2,3]"]), [str(qa), str(rub)])
    got = grpo_probe.probe_prompts(cfg, 12, seed=0)
    assert [p.prompt_id for p in got] == [p.prompt_id for p in grpo_probe.probe_prompts(cfg, 12, seed=0)]
    assert [p.prompt_id for p in got] != [p.prompt_id for p in grpo_probe.probe_prompts(cfg, 12, seed=1)]
    assert all(p.kind == "qa" and p.record["hops"] in (2, 3) and p.record["split"] == "train" for p in got)
    assert len({p.prompt_id for p in got}) == 12
    # --qa-hops: another run's hop counts, so runs trained on different questions are probed on the same ones.
    assert {p.record["hops"] for p in grpo_probe.probe_prompts(cfg, 10, seed=0, qa_hops=[4])} == {4}
    with pytest.raises(ValueError, match="pool has 10 prompts, fewer than --n 11"):
        grpo_probe.probe_prompts(cfg, 11, seed=0, qa_hops=[4])
