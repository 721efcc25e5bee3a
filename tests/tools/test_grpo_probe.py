"""tools/grpo_probe.py: the trend of a fixed probe set's r_base over checkpoints, its bootstrap interval over
prompts, and the first-vs-last pairing (the end-to-end run on a tiny GRPO run is in tests/train/test_grpo.py)."""

import importlib.util
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


@pytest.mark.parametrize("shape", [(5,), (5, 3), (0, 6)])
def test_trend_refuses_outcomes_that_do_not_match_the_steps(shape):
    with pytest.raises(ValueError, match="outcomes"):
        grpo_probe.trend(STEPS, np.zeros(shape))
