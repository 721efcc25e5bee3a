"""The learning figures of GRPO runs (issue 12 §4, the ablations of issue 14 §2) from their metrics.jsonl:
linear-fit slopes with 95% intervals and a PNG of the training curves, one panel per metric, the runs overlaid.

    python tools/grpo_report.py --run RUN [--out curves.png]
    python tools/grpo_report.py --run gated=RUN_A linear=RUN_B ... [--steps N] [--out curves.png]

`--steps N` keeps steps 1..N of each run (to compare a longer run's first N steps with shorter ablations).
With several runs, each run after the first is also compared with the first step by step ("paired"): the mean of
run_t − first_t over the steps t ≥ 2 both have, with its 95% Student-t interval. Runs from the same checkpoint,
seed and prompts (the ablations) sample step 1 with the same weights and keys, so their step-1 rollouts are
the same and only later steps can differ; the steps are not independent (each policy drifts on its own), so the
interval is indicative.

Slope: ordinary least squares of the metric on the step, with the 95% interval slope ± t(0.975, n−2)·SE; "rises"
means the whole interval lies above 0 (falls: below 0).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

PANELS = ("reward/base", "reward/preference", "reward/score/mean", "penalty/tool", "penalty/length",
          "rollout_corr/kl", "canary/logp_abs_diff_max", "grad_norm", "tool_calls", "response_length",
          "actor/entropy", "reward/frac_zero_std_groups")
SLOPES = ("reward/base", "reward/preference", "penalty/tool", "penalty/length", "penalty/eff", "tool_calls",
          "response_length", "rollout_corr/kl")


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def slope(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """OLS slope of y on x with its 95% interval (Student t, n − 2 degrees of freedom)."""
    from scipy import stats

    n = len(x)
    if np.ptp(y) == 0:  # a constant series: no interval to compute
        return {"slope": 0.0, "lo": 0.0, "hi": 0.0, "n": n, "first": float(y[0]), "last": float(y[-1]),
                "mean": float(y.mean()), "trend": "constant"}
    fit = stats.linregress(x, y)
    half = stats.t.ppf(0.975, n - 2) * fit.stderr if n > 2 else math.inf
    trend = "rises" if fit.slope - half > 0 else "falls" if fit.slope + half < 0 else "flat (interval spans 0)"
    return {"slope": fit.slope, "lo": fit.slope - half, "hi": fit.slope + half, "n": n,
            "first": float(y[0]), "last": float(y[-1]), "mean": float(y.mean()), "trend": trend}


def _named(spec: str) -> tuple[str, Path]:
    name, sep, path = spec.partition("=")
    return (name, Path(path)) if sep else (Path(spec).name, Path(spec))


def slopes(data: list[dict]) -> dict[str, dict[str, float]]:
    report = {}
    for key in SLOPES:
        pts = [(r["step"], r[key]) for r in data if key in r]
        if len(pts) >= 3:
            x, y = map(np.asarray, zip(*pts))
            report[key] = slope(x.astype(float), y.astype(float))
    return report


def paired(base: list[dict], other: list[dict]) -> dict[str, dict[str, float]]:
    """Mean per-step difference other − base over the common steps ≥ 2, with its 95% interval (module docstring)."""
    from scipy import stats

    out = {}
    for key in SLOPES:
        a = {r["step"]: r[key] for r in base if key in r and r["step"] >= 2}
        b = {r["step"]: r[key] for r in other if key in r and r["step"] >= 2}
        d = np.asarray([b[t] - a[t] for t in sorted(a.keys() & b.keys())], float)
        if len(d) >= 2:
            half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
            out[key] = {"mean_diff": float(d.mean()), "lo": float(d.mean() - half), "hi": float(d.mean() + half),
                        "n": len(d)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", nargs="+", required=True, help="RUN directories, or NAME=RUN to label them")
    ap.add_argument("--steps", type=int, help="keep steps 1..N of each run")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    runs = {}
    for name, path in map(_named, args.run):
        data = rows(path)
        runs[name] = [r for r in data if args.steps is None or r["step"] <= args.steps]
    report = {name: slopes(data) for name, data in runs.items()}
    first = next(iter(runs))
    if len(runs) > 1:
        report["paired"] = {f"{name} - {first}": paired(runs[first], data) for name, data in runs.items()
                            if name != first}
    print(json.dumps(report[first] if len(runs) == 1 else report, indent=2))
    if args.out:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        cols = 4
        fig, axes = plt.subplots(math.ceil(len(PANELS) / cols), cols, figsize=(4 * cols, 2.8 * 3), squeeze=False)
        for ax, key in zip(axes.flat, PANELS):
            for i, (name, data) in enumerate(runs.items()):  # one colour per run in every panel
                pts = [(r["step"], r[key]) for r in data if key in r]
                if pts:
                    x, y = zip(*pts)
                    ax.plot(x, y, marker=".", label=name, color=f"C{i}")
            ax.set_title(key, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
        if len(runs) > 1:
            axes.flat[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.out, dpi=110)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
