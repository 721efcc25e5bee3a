"""CLI: `searchjax pipeline` — the whole recipe as one run of stages (searchjax.pipeline)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from searchjax.cli.common import CLIError, check_input_file, run_command


@run_command
def _pipeline(args: argparse.Namespace) -> int:
    from searchjax.pipeline import load_recipe, run_pipeline, summary_lines

    cfg = load_recipe(check_input_file(args.config, "--config"))
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out}: exists and is not a directory")
    report = run_pipeline(cfg, out, until=args.until, force=tuple(args.force or ()))
    print(json.dumps(report, indent=1))
    for line in summary_lines(out):
        print(line)
    return 0


def register(subparsers) -> None:
    from searchjax.pipeline import STAGE_NAMES

    p = subparsers.add_parser("pipeline", help="the whole recipe: data, pretraining, SFT, reward model, GRPO, eval",
                              description="Run the recipe's stages under --out, skipping those whose config and "
                                          "inputs are unchanged (searchjax.pipeline).")
    p.add_argument("--config", required=True, help="a recipe YAML (configs/pipeline/demo.yaml)")
    p.add_argument("--out", required=True, help="output directory (a rerun skips the unchanged stages)")
    p.add_argument("--until", choices=STAGE_NAMES, help="stop after this stage")
    p.add_argument("--force", nargs="+", choices=STAGE_NAMES, metavar="STAGE", help="rerun these stages")
    p.set_defaults(func=_pipeline)
