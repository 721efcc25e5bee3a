"""`searchjax train STAGE`: run a training stage (lm, sft, ...) into a run directory.

    searchjax train sft --config configs/train/sft_tiny.yaml --model DIR --data FILE [--dev FILE] --out RUN
                        [--overwrite] [key.sub=value ...]

The config is the YAML plus the dotted overrides (checked like the file: an unknown key lists the valid ones);
`--data` / `--dev` replace the config's data sources. A second start on RUN resumes it; `--overwrite` starts
afresh. Everything is checked before the model is loaded.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from searchjax.cli.common import CLIError, check_input_file


def _run(stage_name: str):
    def run(args: argparse.Namespace) -> int:
        from searchjax.distributed import initialize_from_config
        from searchjax.train.config import load_train_config
        from searchjax.train.stages import STAGES

        stage = STAGES[stage_name].load()
        for path in [*(args.data or []), *(args.dev or [])]:
            check_input_file(path, "data file")
        if not Path(args.model).is_dir():
            raise CLIError(f"--model {args.model}: no such checkpoint directory")
        if Path(args.out).exists() and not Path(args.out).is_dir():
            raise CLIError(f"--out {args.out}: exists and is not a directory")
        cfg = load_train_config(stage.Config, args.config, args.overrides)
        cfg = stage.with_files(cfg, args.data, args.dev)
        initialize_from_config(cfg.distributed)
        summary = stage.run(cfg, args.model, args.out, args.overwrite)
        print(json.dumps(summary, indent=2, default=float))
        return 0

    return run


def _export(args: argparse.Namespace) -> int:
    from searchjax.train.causal import export_checkpoint

    if not (Path(args.run) / "run.json").exists():
        raise CLIError(f"--run {args.run}: not a run directory (no run.json)")
    if Path(args.out).exists() and not args.overwrite:
        raise CLIError(f"--out {args.out}: exists (pass --overwrite to replace it)")
    step = export_checkpoint(args.run, args.out, args.step)
    print(f"exported step {step} of {args.run} to {args.out}")
    return 0


def register(subparsers) -> None:
    from searchjax.train.stages import STAGES

    train = subparsers.add_parser("train", help="train a stage: lm pretraining, SFT, ...",
                                  description=__doc__.splitlines()[0])
    stages = train.add_subparsers(dest="stage", metavar="STAGE", title="stages")
    stages.required = True
    for name, stage in STAGES.items():
        if not stage.supervised:
            continue
        p = stages.add_parser(name, help=stage.help, description=stage.help)
        p.add_argument("--config", help="stage YAML (configs/train/); default: the built-in defaults")
        p.add_argument("--model", required=True, help="HF-format checkpoint to start from (tokenizer.json inside)")
        p.add_argument("--data", nargs="+", help="training data file(s); replace the config's sources")
        p.add_argument("--dev", nargs="+", help="dev data file(s) for the eval loss; replace the config's dev set")
        p.add_argument("--out", required=True, help="run directory (resumed when it holds this run)")
        p.add_argument("--overwrite", action="store_true", help="remove RUN and start afresh")
        p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides, e.g. steps=200")
        p.set_defaults(func=_run(name))
    _register_grpo(stages, STAGES["grpo"])
    p = stages.add_parser("export", help="write a checkpoint of an lm, sft or grpo run as an HF checkpoint",
                          description="write a checkpoint of an lm, sft or grpo run as an HF checkpoint")
    p.add_argument("--run", required=True, help="run directory")
    p.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    p.add_argument("--out", required=True, help="HF checkpoint directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace --out")
    p.set_defaults(func=_export)


def _grpo(args: argparse.Namespace) -> int:
    from searchjax.cli.common import check_input_dir, open_search_backend
    from searchjax.distributed import initialize_from_config
    from searchjax.train.config import load_train_config
    from searchjax.train.grpo import GRPOConfig, run_grpo, with_prompts

    for path in args.prompts or []:
        check_input_file(path, "--prompts")
    for path, flag in ((args.policy, "--policy"), (args.reference, "--reference"),
                       (args.reward_model, "--reward-model")):
        check_input_dir(path, flag, needs=("config.json", "tokenizer.json"))
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise CLIError(f"--out {args.out}: exists and is not a directory")
    cfg = with_prompts(load_train_config(GRPOConfig, args.config, args.overrides), args.prompts)
    backend = open_search_backend(args.index)
    initialize_from_config(cfg.distributed)
    summary = run_grpo(cfg, args.policy, args.reference, args.reward_model, backend, args.out, args.overwrite)
    print(json.dumps(summary, indent=2, default=float))
    return 0


def _register_grpo(stages, stage) -> None:
    from searchjax.cli.common import INDEX_HELP

    p = stages.add_parser("grpo", help=stage.help, description=stage.help)
    p.add_argument("--config", help="stage YAML (configs/train/grpo_*.yaml); default: the built-in defaults")
    p.add_argument("--policy", required=True, help="HF checkpoint to start the policy from (normally the SFT one)")
    p.add_argument("--reference", required=True, help="the frozen reference policy (normally the SFT checkpoint)")
    p.add_argument("--reward-model", required=True, help="reward-model checkpoint (`searchjax train rm` RUN/final)")
    p.add_argument("--prompts", nargs="+", help="QA / rubric prompt JSONL files; replace the config's mix")
    p.add_argument("--index", required=True, help=INDEX_HELP)
    p.add_argument("--out", required=True, help="run directory (resumed when it holds this run)")
    p.add_argument("--overwrite", action="store_true", help="remove RUN and start afresh")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides, e.g. steps=20")
    p.set_defaults(func=_grpo)
