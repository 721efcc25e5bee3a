"""tools/grpo_snr.py: the signal and noise of per-batch gradients from their Gram matrix."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "tools" / "grpo_snr.py"
_spec = importlib.util.spec_from_file_location("grpo_snr", _PATH)
grpo_snr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grpo_snr)


@pytest.mark.parametrize("noise", [0.5, 4.0])
def test_signal_and_noise_recovered_from_synthetic_gradients(noise):
    rng = np.random.default_rng(0)
    k, d = 48, 20_000
    s = rng.normal(size=d)
    s /= np.linalg.norm(s)  # ‖s‖² = 1
    g = s + rng.normal(scale=np.sqrt(noise / d), size=(k, d))  # E‖n‖² = noise
    out = grpo_snr.signal_stats(g @ g.T, rollouts=16)
    assert out["signal2"] == pytest.approx(1.0, abs=4 * out["signal2_se"] + 0.02)
    assert out["noise2"] == pytest.approx(noise, rel=0.1)
    assert out["signal_share"] == pytest.approx(1 / (1 + noise), rel=0.1)
    # signal ≥ noise once the step averages noise / signal² batches of 16 rollouts.
    assert out["rollouts_for_snr_1"] == pytest.approx(16 * out["noise2"] / out["signal2"])
    assert out["rollouts_for_snr_1"] == pytest.approx(16 * noise, rel=0.15)


def test_pure_noise_has_no_signal_and_zero_gradients_give_none():
    rng = np.random.default_rng(1)
    g = rng.normal(size=(32, 5_000))
    out = grpo_snr.signal_stats(g @ g.T, rollouts=16)
    assert abs(out["signal2"]) <= 4 * out["signal2_se"]
    assert abs(out["mean_cos_between_batches"]) < 0.01
    zero = grpo_snr.signal_stats(np.zeros((4, 4)), rollouts=16)
    assert zero["signal_share"] is None and zero["mean_cos_between_batches"] is None
    assert zero["rollouts_for_snr_1"] is None
