"""Learning curves of training runs from their metrics.jsonl, as one PNG.

    python tools/plot_curves.py --run LABEL=RUN [--run LABEL=RUN ...] --out curves.png [--keys loss dev/loss]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series(run: Path, key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if key in row:
            steps.append(row["step"])
            values.append(row[key])
    return steps, values


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", required=True, help="LABEL=RUN_DIR")
    ap.add_argument("--out", required=True)
    ap.add_argument("--keys", nargs="+", default=["loss", "dev/loss"])
    args = ap.parse_args(argv)
    fig, axes = plt.subplots(1, len(args.run), figsize=(5 * len(args.run), 3.6), squeeze=False)
    for ax, spec in zip(axes[0], args.run):
        label, _, path = spec.partition("=")
        for key in args.keys:
            x, y = series(Path(path), key)
            if x:
                ax.plot(x, y, marker="o" if key.startswith("dev") else None, label=key)
        ax.set_title(label)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("loss (nats/token)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
