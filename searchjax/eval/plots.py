"""The evaluation's figures, from summary rows: the tool-efficiency curve and accuracy against cost.

tool_efficiency.png: accuracy against the tool-call budget b, one line per model with its 95% interval shaded
(the write-up's Figure 5). cost_accuracy.png: accuracy against cents per query, one line per model through its
budgets, each point marked with its b. Figures are built as `matplotlib.figure.Figure` objects, without pyplot's
global state or a display, and rendered to PNG by the Agg canvas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from searchjax.atomic import atomic_path

COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray")


def _series(summary: Sequence[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    rows = [r for r in summary if r["model"] == model and not math.isnan(r["accuracy"])]
    return sorted(rows, key=lambda r: r["budget"])


def _save(fig, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")


def tool_efficiency_figure(summary: Sequence[dict[str, Any]], models: Sequence[str], title: str = ""):
    """Accuracy against b, one line per model (returns the matplotlib Figure)."""
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.subplots()
    for i, model in enumerate(models):
        s = _series(summary, model)
        b = [r["budget"] for r in s]
        color = COLORS[i % len(COLORS)]
        ax.plot(b, [r["accuracy"] for r in s], marker="o", color=color, label=model)
        ax.fill_between(b, [r["accuracy_lo"] for r in s], [r["accuracy_hi"] for r in s], color=color, alpha=0.15,
                        linewidth=0)
    ax.set_xlabel("tool-call budget b")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    budgets = sorted({r["budget"] for r in summary})
    ax.set_xticks(budgets)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    ax.set_title(title or "Tool efficiency (95% Wilson intervals)")
    return fig


def cost_accuracy_figure(summary: Sequence[dict[str, Any]], models: Sequence[str], title: str = ""):
    """Accuracy against cents per query, one line per model through its budgets (returns the Figure)."""
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.subplots()
    for i, model in enumerate(models):
        s = _series(summary, model)
        x, y = [r["cents_per_query"] for r in s], [r["accuracy"] for r in s]
        ax.plot(x, y, marker="o", color=COLORS[i % len(COLORS)], label=model)
        for r, xi, yi in zip(s, x, y):
            ax.annotate(f"b={r['budget']}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("cents per query (list prices)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    ax.set_title(title or "Accuracy against cost per query")
    return fig


def write_figures(summary: Sequence[dict[str, Any]], models: Sequence[str], out_dir: Path, title: str = "") -> None:
    """tool_efficiency.png and cost_accuracy.png in `out_dir`, each written atomically."""
    _save(tool_efficiency_figure(summary, models, title), out_dir / "tool_efficiency.png")
    _save(cost_accuracy_figure(summary, models, title), out_dir / "cost_accuracy.png")
