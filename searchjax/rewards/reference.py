"""A straightforward per-rollout Python implementation of RECIPE.md §4 (+ §2 advantages), for checking.

Loops over groups and rollouts with Python floats and `math`, written from the equations independently of the
vectorised `searchjax.rewards` code; each group's anchors (b_g, Ŵ_g, b_win, b_lose, the cap) are computed once
per group, then every rollout's values in a per-rollout loop. The tests use it as an oracle and tools/bench_rewards.py as the baseline
the jitted `compute_rewards` is timed against. The tool baseline b_g is an input (draw it with
`draw_baselines_python` or take `RewardBreakdown.tool_baseline`), so both sides can be fed the same b_g.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from searchjax.rewards.config import RewardConfig

Grid = Sequence[Sequence[float]]


def _valid(mask: Grid, g: int) -> list[int]:
    return [i for i, m in enumerate(mask[g]) if m]


def draw_baselines_python(records: dict[str, Grid], rng: random.Random) -> list[float]:
    """b_g ~ integer Unif[min_{W_g} c̃, ⌈mean_{W_g} c̃⌉] per group with Python's `random` (0 without winners)."""
    out = []
    for g in range(len(records["mask"])):
        eff = [records["calls"][g][i] - records["failures"][g][i] for i in _valid(records["mask"], g)
               if records["correct"][g][i] > 0.5]
        out.append(float(rng.randint(int(math.ceil(min(eff))), math.ceil(sum(eff) / len(eff)))) if eff else 0.0)
    return out


def _tool(records: dict[str, Grid], g: int, i: int, b_g: float, has_winner: bool, cfg: RewardConfig) -> float:
    eff = records["calls"][g][i] - records["failures"][g][i]
    p = 1.0 - math.exp(-max(0.0, eff - b_g)) if has_winner else 0.0
    if records["correct"][g][i] > 0.5:
        return cfg.alpha_win * p
    return cfg.alpha_lose * p + cfg.beta_lose


def _length_anchors(records: dict[str, Grid], g: int, cfg: RewardConfig) -> tuple[set[int], float, float, float]:
    """Group g's shaping set Ŵ_g, b_win, b_lose and the hard cap, computed once per group (0.0 for an empty mean)."""
    valid = _valid(records["mask"], g)
    ref = records["ref_lengths"][g]
    shaping = {j for j in valid
               if records["correct"][g][j] > 0.5 and records["preference"][g][j] >= cfg.preferred_threshold}
    losers = [j for j in valid if j not in shaping]
    b_win = sum(ref[j] for j in shaping) / len(shaping) if shaping else 0.0
    b_lose = sum(ref[j] for j in losers) / len(losers) if losers else 0.0
    cap = cfg.max_length if cfg.max_length is not None else max(ref[j] for j in valid)
    return shaping, b_win, b_lose, cap


def _length(length: float, in_shaping: bool, b_win: float, b_lose: float, cap: float) -> float:
    if length > cap:
        return 1.0
    if in_shaping:
        if b_win == 0:
            return 1.0 if length > 0 else 0.0
        return 1.0 - math.exp(-max(0.0, length / b_win - 1.0))
    if length == 0:
        return 1.0
    return 1.0 - math.exp(-max(0.0, b_lose / length - 1.0))


def _advantages(rewards: list[float], cfg: RewardConfig) -> list[float]:
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if not cfg.normalize_std:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / len(centred))
    return [c / (std + cfg.adv_eps) for c in centred]


def reference_rewards(records: dict[str, Grid], baselines: Sequence[float], cfg: RewardConfig) -> dict:
    """Per-rollout R, Â and components as nested lists [N][G] (0.0 on invalid entries).

    records: the `RolloutRecords` fields as nested lists (correct, preference, calls, failures, lengths,
    ref_lengths, mask). Only cfg.aggregation = "gated"/"linear" and cfg.penalties = "anchored" are covered.
    """
    if cfg.penalties != "anchored":
        raise ValueError("reference_rewards covers the anchored penalties only")
    names = ("reward", "advantages", "tool_penalty", "length_penalty", "efficiency_penalty")
    out: dict[str, list[list[float]]] = {k: [] for k in names}
    for g, row in enumerate(records["mask"]):
        valid = _valid(records["mask"], g)
        has_winner = any(records["correct"][g][i] > 0.5 for i in valid)
        rows = {k: [0.0] * len(row) for k in names}
        if valid:
            shaping, b_win, b_lose, cap = _length_anchors(records, g, cfg)
        for i in valid:
            tool = _tool(records, g, i, baselines[g], has_winner, cfg)
            length = _length(records["lengths"][g][i], i in shaping, b_win, b_lose, cap)
            pen = cfg.lambda_tool * tool + cfg.lambda_len * length
            r_base, s = records["correct"][g][i], records["preference"][g][i]
            credit = r_base * s if cfg.aggregation == "gated" else r_base + cfg.linear_weight * s
            rows["tool_penalty"][i], rows["length_penalty"][i] = tool, length
            rows["efficiency_penalty"][i], rows["reward"][i] = pen, credit - pen
        if valid:
            for i, a in zip(valid, _advantages([rows["reward"][i] for i in valid], cfg)):
                rows["advantages"][i] = a
        for k in names:
            out[k].append(rows[k])
    return out
