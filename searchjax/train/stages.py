"""The training stages `searchjax train STAGE` knows, by module (imported only when the stage runs).

A supervised stage module defines `Config` (its TrainConfig subclass), `with_files(cfg, data, dev) -> cfg` (the
`--data` / `--dev` files as its sources) and `run(cfg, model, out, overwrite) -> summary dict`. Every stage has
the same command line: `--config FILE --model DIR --data FILE [FILE ...] [--dev FILE ...] --out RUN
[--overwrite] [key.sub=value ...]`.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType


@dataclasses.dataclass(frozen=True)
class Stage:
    """supervised: the shared command line above; False for a stage with its own (GRPO: searchjax.cli.train)."""

    name: str
    help: str
    module: str
    supervised: bool = True

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)


STAGES: dict[str, Stage] = {
    "lm": Stage("lm", "next-token pretraining on a corpus (the offline base model)", "searchjax.train.lm"),
    "sft": Stage("sft", "SFT warm-up on tool-use trajectories and preference-style examples (RECIPE.md §1)",
                 "searchjax.train.sft"),
    "rm": Stage("rm", "Bradley–Terry reward model on preference pairs (RECIPE.md §4)", "searchjax.train.reward_model"),
    "grpo": Stage("grpo", "on-policy GRPO with token-level IS: rollouts, gated rewards, updates (RECIPE.md §2-§4)",
                  "searchjax.train.grpo", supervised=False),
}
