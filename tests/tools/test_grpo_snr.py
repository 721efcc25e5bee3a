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


def test_per_call_slopes_recover_a_within_group_slope_and_ignore_group_offsets():
    """Two strata; in every group logit = offset_g + slope · calls + noise, the head part carrying −0.5 per call
    and the likelihood part the rest; groups whose calls never vary add nothing (and alone give None)."""
    from searchjax.rewards import group_covariance

    rng = np.random.default_rng(2)
    n, g = 40, 8
    calls = rng.integers(0, 6, (n, g)).astype(np.float32)
    calls[-1] = 3.0  # a group whose calls do not vary
    slope = np.where(np.arange(n) < n // 2, -2.0, 1.0)[:, None]  # stratum "a": −2 per call, "b": +1
    head = -0.5 * calls + rng.normal(size=(n, 1)) * 5
    lik = (slope + 0.5) * calls + rng.normal(scale=0.01, size=(n, g))
    mask = np.ones((n, g), bool)
    parts = {"head": head, "likelihood": lik, "logit": head + lik}
    covs = [{k: np.asarray(group_covariance(v, calls, mask)) for k, v in parts.items()}]
    var = [np.asarray(group_covariance(calls, calls, mask))]
    strata = ["a"] * (n // 2) + ["b"] * (n // 2)
    out = grpo_snr.per_call_slopes(covs, var, strata)
    assert out["a"]["logit"] == pytest.approx(-2.0, abs=0.01) and out["b"]["logit"] == pytest.approx(1.0, abs=0.01)
    assert out["a"]["head"] == pytest.approx(-0.5, abs=1e-4) and out["b"]["likelihood"] == pytest.approx(1.5, abs=0.01)
    flat = grpo_snr.per_call_slopes([{k: v[-1:] for k, v in covs[0].items()}], [var[0][-1:]], ["b"])
    assert flat["all"]["logit"] is None
