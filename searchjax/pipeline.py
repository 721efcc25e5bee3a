"""The whole recipe as one run: world → index → data → tokenizer → pretraining → SFT → reward model → GRPO →
evaluation, each stage a `searchjax` command writing under OUT/<stage>/.

    searchjax pipeline --config configs/pipeline/demo.yaml --out DIR [--until STAGE] [--force STAGE]

Every stage is the project's own command line (the commands are tested on their own, check their inputs, write
atomically and refuse bad input in one line), run as a subprocess so a stage that fails or is killed leaves the
stages before it intact. After a stage succeeds its directory gets `stage.json`:

    hash = sha256(the stage's argv with OUT-relative paths, the bytes of every config file it reads,
                  the hashes of the stages it reads from)

A stage whose `stage.json` holds the hash it would have now is skipped; any other is removed and run again, and
since each hash folds in its inputs' hashes, a changed config reruns that stage and every stage after it.
`--force STAGE` reruns that stage even when unchanged (its hash stays the same, so the stages after it are kept).

A stage that was started but did not finish (killed, out of memory, a failure) is run again on the next start.
The training and evaluation stages resume where they stopped (their commands resume a run directory: the newest
checkpoint, the finished trajectories) when `attempt.json` in the stage's directory holds the hash the stage has
now; every other stage, and any stage whose hash changed or that is forced, starts from an empty directory.
`--until STAGE` stops after it. At the end the summary prints the evaluation table and the paths of the plots and
of the tensorboard logs (`tensorboard --logdir OUT`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from searchjax.atomic import atomic_write_text
from searchjax.config import ConfigError, load_yaml

STAGE_FILE = "stage.json"
ATTEMPT_FILE = "attempt.json"


class StageError(ValueError):
    """A stage failed; the message names it, its last log line and the log file."""


@dataclasses.dataclass(frozen=True)
class TrainStage:
    """A training stage: its YAML (configs/train/) and dotted overrides on top."""

    config: str
    overrides: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class RecipeConfig:
    """configs/pipeline/*.yaml. Sizes of the world and the data, the model preset, each training stage's config,
    the evaluation's settings. Paths of config files are relative to the repository's configs/ parent (or
    absolute). `induction`, when set, is a `train lm` stage on copy rows between base_init and lm (lm then starts
    from it): a first phase that teaches the randomly initialised model to copy from its context
    (configs/train/lm_induction_science.yaml says why); None = lm starts from base_init."""

    seed: int = 0
    world_docs: int = 1500
    real_cities: int = 20
    vocab_size: int = 1024
    prompt_phrases: bool = False
    questions: int = 60
    qa_config: str = "configs/data/synth_qa.yaml"
    rubric_prompts: int = 20
    sft_results: int = 2
    sft_thoughts: str = "plain"
    sft_recovery: float = 0.0
    abstention: int = 4
    pairs_per_category: int = 20
    preset: str = "tiny"
    induction: TrainStage | None = None
    lm: TrainStage = TrainStage("configs/train/lm_tiny.yaml")
    sft: TrainStage = TrainStage("configs/train/sft_tiny.yaml")
    rm: TrainStage = TrainStage("configs/train/rm_tiny.yaml")
    grpo: TrainStage = TrainStage("configs/train/grpo_tiny.yaml")
    eval_questions: int = 10
    eval_budgets: str = "0-10"
    eval_max_new_tokens: int = 96
    eval_max_len: int = 2048
    eval_slots: int = 16

    def __post_init__(self):
        for name in ("world_docs", "vocab_size", "questions", "rubric_prompts", "sft_results", "eval_questions"):
            if getattr(self, name) < 1:
                raise TypeError(f"{name} must be >= 1, got {getattr(self, name)}")
        from searchjax.data.sft import THOUGHT_STYLES

        if self.sft_thoughts not in THOUGHT_STYLES:
            raise TypeError(f"sft_thoughts must be one of {list(THOUGHT_STYLES)}, got {self.sft_thoughts!r}")
        if not 0.0 <= self.sft_recovery <= 1.0:
            raise TypeError(f"sft_recovery must be a share in [0, 1], got {self.sft_recovery!r}")


@dataclasses.dataclass(frozen=True)
class Stage:
    """One step: its name, the stages it reads, the argv (paths inside OUT as "{OUT}/..."), the config files it
    reads, what it produces (checked after the run) and, instead of a command, an in-process function with the
    recipe fields it uses (`params`, hashed in place of the argv). `resumable`: its command continues an
    interrupted run in the same directory (module docstring)."""

    name: str
    after: tuple[str, ...]
    argv: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    produces: tuple[str, ...] = ()
    run: Callable[[Path], None] | None = None
    params: tuple[tuple[str, Any], ...] = ()
    resumable: bool = False


def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def _config_path(path: str) -> str:
    p = Path(path)
    return str(p if p.is_absolute() else repo_root() / p)


def heldout_questions(qa: Path, out: Path, n: int) -> None:
    """The first n questions of split dev (never trained on: SFT, RM and GRPO read split train only), one per chain
    (a chain asked with several openers, `SynthConfig.phrasings`, counts once)."""
    from searchjax.data.jsonl import read_jsonl, write_jsonl
    from searchjax.data.synth import one_per_chain

    rows = one_per_chain(r for r in read_jsonl(qa)[0] if r.get("split") == "dev")[:n]
    if not rows:
        raise ValueError(f"{qa}: no questions of split dev to hold out (more questions, or a dev_fraction > 0)")
    write_jsonl(out, rows)


# the recipe's training-stage fields -> the `searchjax train` stage that runs them (stages() builds their commands
# from it, check_train_configs loads their configs with it)
TRAIN_STAGE_KINDS = {"induction": "lm", "lm": "lm", "sft": "sft", "rm": "rm", "grpo": "grpo"}


def stages(cfg: RecipeConfig) -> list[Stage]:
    """The recipe's stages in order (module docstring)."""
    o, s = "{OUT}", str(cfg.seed)
    sj = ("searchjax",)

    def train(name: str, *args: str) -> tuple[str, ...]:
        t: TrainStage = getattr(cfg, name)
        return (*sj, "train", TRAIN_STAGE_KINDS[name], "--config", _config_path(t.config), *args, "--out",
                f"{o}/{name}/run", "progress=false", *t.overrides)

    induction = [] if cfg.induction is None else [
        Stage("induction", ("base_init", "world"),
              train("induction", "--model", f"{o}/base_init/model", "--data", f"{o}/world/world/corpus.jsonl"),
              reads=(cfg.induction.config,), produces=("induction/run/final",), resumable=True)]
    lm_start = "induction/run/final" if induction else "base_init/model"

    return [
        Stage("world", (), (*sj, "world", "build", "--out", f"{o}/world/world", "--seed", s, "--docs",
                            str(cfg.world_docs), "--real-cities", str(cfg.real_cities)), produces=("world/world",)),
        Stage("index", ("world",), (*sj, "index", "build", "--corpus", f"{o}/world/world/corpus.jsonl", "--out",
                                    f"{o}/index/index"), produces=("index/index",)),
        Stage("qa", ("world", "index"), (*sj, "data", "synth-qa", "--world", f"{o}/world/world", "--index",
                                         f"{o}/index/index", "--config", _config_path(cfg.qa_config), "--n",
                                         str(cfg.questions), "--seed", s, "--quiet", "--out", f"{o}/qa/qa.jsonl"),
              reads=(cfg.qa_config,), produces=("qa/qa.jsonl",)),
        Stage("rubric", (), (*sj, "data", "rubric", "--n", str(cfg.rubric_prompts), "--seed", s, "--out",
                             f"{o}/rubric/rubric.jsonl"), produces=("rubric/rubric.jsonl",)),
        Stage("sft_data", ("world", "index", "qa", "rubric"),
              (*sj, "data", "sft", "--world", f"{o}/world/world", "--index", f"{o}/index/index", "--qa",
               f"{o}/qa/qa.jsonl", "--rubric", f"{o}/rubric/rubric.jsonl", "--results", str(cfg.sft_results),
               "--abstention", str(cfg.abstention), "--thoughts", cfg.sft_thoughts, "--recovery",
               str(cfg.sft_recovery), "--seed", s, "--out", f"{o}/sft_data/sft.jsonl"),
              produces=("sft_data/sft.jsonl",)),
        # The BPE learns from the corpus and the rendered SFT conversations: the chat template and the tool-call
        # syntax then get merges of their own, which shortens every trajectory the later stages train on.
        Stage("tokenizer", ("world", "sft_data"),
              (*sj, "tokenizer", "train", "--corpus", f"{o}/world/world/corpus.jsonl", f"{o}/sft_data/sft.jsonl",
               "--vocab-size", str(cfg.vocab_size), *(("--prompt-phrases",) if cfg.prompt_phrases else ()),
               "--out", f"{o}/tokenizer/tokenizer.json"),
              produces=("tokenizer/tokenizer.json",)),
        Stage("preferences", ("world", "index", "qa", "rubric"),
              (*sj, "data", "preferences", "--world", f"{o}/world/world", "--index", f"{o}/index/index", "--qa",
               f"{o}/qa/qa.jsonl", "--rubric", f"{o}/rubric/rubric.jsonl", "--pairs-per-category",
               str(cfg.pairs_per_category), "--results", str(cfg.sft_results), "--thoughts", cfg.sft_thoughts,
               "--seed", s, "--out",
               f"{o}/preferences/preferences.jsonl"),
              produces=("preferences/preferences.jsonl",)),
        Stage("heldout", ("qa",), produces=("heldout/heldout.jsonl",),
              run=lambda out: heldout_questions(out / "qa" / "qa.jsonl", out / "heldout" / "heldout.jsonl",
                                                cfg.eval_questions), params=(("eval_questions", cfg.eval_questions),)),
        Stage("base_init", ("tokenizer",), (*sj, "model", "init", "--preset", cfg.preset, "--seed", s, "--tokenizer",
                                            f"{o}/tokenizer/tokenizer.json", "--out", f"{o}/base_init/model"),
              produces=("base_init/model",)),
        *induction,
        Stage("lm", (lm_start.split("/")[0], "world"), train("lm", "--model", f"{o}/{lm_start}", "--data",
                                                               f"{o}/world/world/corpus.jsonl"),
              reads=(cfg.lm.config,), produces=("lm/run/final",), resumable=True),
        Stage("sft", ("lm", "sft_data"), train("sft", "--model", f"{o}/lm/run/final", "--data",
                                               f"{o}/sft_data/sft.jsonl"),
              reads=(cfg.sft.config,), produces=("sft/run/final",), resumable=True),
        Stage("rm", ("sft", "preferences"), train("rm", "--model", f"{o}/sft/run/final", "--data",
                                                  f"{o}/preferences/preferences.jsonl"),
              reads=(cfg.rm.config,), produces=("rm/run/final",), resumable=True),
        Stage("grpo", ("sft", "rm", "qa", "rubric", "index"),
              train("grpo", "--policy", f"{o}/sft/run/final", "--reference", f"{o}/sft/run/final",
                    "--reward-model", f"{o}/rm/run/final", "--prompts", f"{o}/qa/qa.jsonl",
                    f"{o}/rubric/rubric.jsonl", "--index", f"{o}/index/index"),
              reads=(cfg.grpo.config,), produces=("grpo/run/final",), resumable=True),
        Stage("eval", ("lm", "sft", "rm", "grpo", "heldout", "index"),
              (*sj, "eval", "--model", f"start={o}/lm/run/final", "--model", f"sft={o}/sft/run/final", "--model",
               f"sft+rl={o}/grpo/run/final", "--index", f"{o}/index/index", "--questions",
               f"{o}/heldout/heldout.jsonl", "--budgets", cfg.eval_budgets, "--results", str(cfg.sft_results),
               "--max-new-tokens", str(cfg.eval_max_new_tokens), "--max-len", str(cfg.eval_max_len), "--slots",
               str(cfg.eval_slots), "--seed", s, "--baseline", "sft", "--reward-model", f"{o}/rm/run/final",
               "--quiet", "--out", f"{o}/eval/eval"),
              produces=("eval/eval/summary.csv", "eval/eval/tool_efficiency.png"), resumable=True),
    ]


# Every stage a recipe can have (the optional ones included), in order: what --until and --force accept.
STAGE_NAMES = tuple(st.name for st in stages(RecipeConfig(induction=TrainStage("configs/train/lm_tiny.yaml"))))


def stage_outputs(out: str | Path) -> dict[str, Path]:
    """Each stage's main output under `out` (its first declared product): what a later tool opens, e.g.
    stage_outputs(out)["sft"] is the SFT policy."""
    return {st.name: Path(out) / st.produces[0] for st in stages(RecipeConfig()) if st.produces}


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stage_hash(stage: Stage, upstream: dict[str, str]) -> str:
    """The stage's hash (module docstring): paths inside the repository are hashed relative to it (the files'
    bytes are in `reads`), so the hash does not depend on where the repository is checked out."""
    h = hashlib.sha256()
    root = str(repo_root())
    argv = [a.replace(root, "{REPO}") for a in stage.argv]
    body = {"name": stage.name, "argv": argv or [list(p) for p in stage.params],
            "reads": {r: _file_digest(Path(_config_path(r))) for r in stage.reads},
            "after": {a: upstream[a] for a in stage.after}}
    h.update(json.dumps(body, sort_keys=True, default=str).encode())
    return h.hexdigest()


def _done_hash(out: Path, name: str, marker: str = STAGE_FILE) -> str | None:
    marker = out / name / marker
    try:
        return json.loads(marker.read_text())["hash"]
    except (OSError, ValueError, KeyError):
        return None


def _argv(stage: Stage, out: Path) -> list[str]:
    argv = [a.replace("{OUT}", str(out)) for a in stage.argv]
    return [sys.executable, "-m", "searchjax.cli.main", *argv[1:]]


def check_train_configs(cfg: RecipeConfig, names: Sequence[str] | None = None) -> None:
    """Each training stage's YAML with its overrides (of the stages in `names`, default all) loads as that stage's
    config, so a wrong key or value fails before the first stage runs, naming the stage, instead of when its stage
    is reached after the ones before it."""
    from searchjax.train.config import load_train_config
    from searchjax.train.stages import STAGES

    for field, kind in TRAIN_STAGE_KINDS.items():
        t = getattr(cfg, field)
        if t is None or (names is not None and field not in names):
            continue
        try:
            load_train_config(STAGES[kind].load().Config, _config_path(t.config), t.overrides)
        except ConfigError as e:
            raise ConfigError(f"stage {field} ({t.config}, overrides {list(t.overrides)}): {e}") from None


def run_pipeline(cfg: RecipeConfig, out: str | Path, *, until: str | None = None, force: tuple[str, ...] = (),
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or skip) every stage up to `until`; returns {stage: {"status": "ran" | "resumed" | "skipped", "s":
    seconds}}."""
    out = Path(out).absolute()
    names = [st.name for st in stages(cfg)]
    for name in (until, *force):
        if name is not None and name not in names:
            raise ValueError(f"unknown stage {name!r}; the stages are {names}")
    check_train_configs(cfg, names if until is None else names[: names.index(until) + 1])
    out.mkdir(parents=True, exist_ok=True)
    hashes: dict[str, str] = {}
    report: dict[str, Any] = {}
    for stage in stages(cfg):
        h = stage_hash(stage, hashes)
        hashes[stage.name] = h
        d = out / stage.name
        outputs_there = all((out / p).exists() for p in stage.produces)
        if _done_hash(out, stage.name) == h and outputs_there and stage.name not in force:
            report[stage.name] = {"status": "skipped"}
            log(f"[{stage.name}] unchanged, skipped")
        else:
            resume = stage.resumable and stage.name not in force and _done_hash(out, stage.name, ATTEMPT_FILE) == h
            if resume:
                log(f"[{stage.name}] resuming its interrupted run")
            else:
                if d.exists():
                    shutil.rmtree(d)
                d.mkdir(parents=True)
                if stage.resumable:
                    atomic_write_text(d / ATTEMPT_FILE, json.dumps({"hash": h}) + "\n")
                log(f"[{stage.name}] running")
            t0 = time.perf_counter()
            if stage.run is not None:
                stage.run(out)
            else:
                env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
                with open(d / "log.txt", "a" if resume else "w") as logf:
                    r = subprocess.run(_argv(stage, out), stdout=logf, stderr=subprocess.STDOUT, env=env)
                if r.returncode != 0:
                    lines = [x for x in (d / "log.txt").read_text().splitlines() if x.strip()]
                    raise StageError(f"stage {stage.name} failed (exit {r.returncode}): "
                                     f"{lines[-1] if lines else 'no output'} (log: {d / 'log.txt'})")
            missing = [p for p in stage.produces if not (out / p).exists()]
            if missing:
                raise StageError(f"stage {stage.name} finished without writing {missing}")
            seconds = time.perf_counter() - t0
            atomic_write_text(d / STAGE_FILE, json.dumps({"hash": h, "argv": list(stage.argv),
                                                          "seconds": round(seconds, 1)}, indent=1) + "\n")
            (d / ATTEMPT_FILE).unlink(missing_ok=True)
            report[stage.name] = {"status": "resumed" if resume else "ran", "s": round(seconds, 1)}
            log(f"[{stage.name}] done in {seconds:.0f} s")
        if stage.name == until:
            break
    return report


def summary_lines(out: Path) -> list[str]:
    """The evaluation table and where the plots and logs are (after an eval stage)."""
    lines = []
    csv = out / "eval" / "eval" / "summary.csv"
    if csv.exists():
        lines += ["", csv.read_text().rstrip(), "",
                  f"plots: {csv.parent / 'tool_efficiency.png'}, {csv.parent / 'cost_accuracy.png'}"]
    lines.append(f"training logs: tensorboard --logdir {out}")
    return lines


def load_recipe(path: str | Path) -> RecipeConfig:
    return load_yaml(RecipeConfig, path)
