"""The inputs a GRPO run or an evaluation reads, as one value: from a `searchjax pipeline` output, or built tiny.

`pipeline_workspace(out)` names the stage outputs of `searchjax pipeline --out OUT` (searchjax.pipeline):

    policy, reference   OUT/sft/run/final          the SFT policy (GRPO starts from it and keeps it as reference)
    reward_model        OUT/rm/run/final
    index               OUT/index/index
    prompts             OUT/qa/qa.jsonl, OUT/rubric/rubric.jsonl
    questions           OUT/heldout/heldout.jsonl  (split dev, never trained on)
    trained             OUT/grpo/run/final         the GRPO policy, when that stage has run (else None)

`tiny_workspace(root)` builds the same layout from package functions in tens of seconds on a CPU: a small world
and its tantivy index, QA with a dev split, a BPE trained on the corpus (`tiny_data`), the `tiny` preset with
random weights as policy and reference (`tiny_policy`), and a reward model with a random backbone and a zero head
(s = 0.5 for every pair). For the tests and the notebooks; nothing in it is trained.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Workspace:
    """Paths of one workspace (module docstring); every checkpoint directory holds its tokenizer.json."""

    policy: Path
    reference: Path
    reward_model: Path
    index: Path
    prompts: tuple[Path, ...]
    questions: Path
    trained: Path | None = None

    def missing(self) -> list[Path]:
        """The paths that do not exist."""
        paths = [self.policy, self.reference, self.reward_model, self.index, *self.prompts, self.questions]
        return [p for p in paths if not p.exists()]


def pipeline_workspace(out: str | Path) -> Workspace:
    """The workspace of a `searchjax pipeline --out OUT` directory; FileNotFoundError listing what is missing."""
    from searchjax.pipeline import stage_outputs

    p = stage_outputs(out)
    ws = Workspace(policy=p["sft"], reference=p["sft"], reward_model=p["rm"], index=p["index"],
                   prompts=(p["qa"], p["rubric"]), questions=p["heldout"], trained=p["grpo"])
    if not ws.trained.exists():
        ws = dataclasses.replace(ws, trained=None)
    missing = ws.missing()
    if missing:
        raise FileNotFoundError(f"{out} is not a finished `searchjax pipeline` output: missing "
                                f"{[str(p) for p in missing]}")
    return ws


def tiny_data(root: str | Path, *, seed: int = 0, docs: int = 400, questions: int = 24, dev_fraction: float = 0.25,
              vocab_size: int = 1024) -> list[dict]:
    """world/ and its index/, qa.jsonl, heldout.jsonl (its dev rows) and a BPE tokenizer.json under `root`.

    Returns the QA rows.
    """
    from searchjax.chat import train_tokenizer
    from searchjax.data.jsonl import write_jsonl
    from searchjax.data.solvers import SearchSolver
    from searchjax.data.synth import QAGenerator, SynthConfig
    from searchjax.search import TantivyBackend, build_index
    from searchjax.search.world import KnowledgeBase, build_world

    root = Path(root)
    world, index = root / "world", root / "index"
    build_world(world, seed=seed, n_docs=docs, n_real_cities=20, progress=False)
    build_index(world / "corpus.jsonl", index, progress=False)
    synth = SynthConfig(n=questions, seed=seed, augment_fraction=0.0, dev_fraction=dev_fraction)
    rows = list(QAGenerator(KnowledgeBase.load(world), SearchSolver(TantivyBackend(index)), synth).generate())
    write_jsonl(root / "qa.jsonl", rows)
    write_jsonl(root / "heldout.jsonl", [r for r in rows if r.get("split") == "dev"] or rows)
    train_tokenizer([world / "corpus.jsonl"], vocab_size, root / "tokenizer.json")
    return rows


def tiny_policy(path: str | Path, tokenizer_json: str | Path, key) -> Path:
    """The `tiny` preset at the tokenizer's vocabulary, random weights from `key`, saved in HF format with a copy of
    `tokenizer_json` (what `--model` / `--policy` read); returns `path`."""
    from searchjax.chat import load_tokenizer
    from searchjax.model import init_params, load_preset, save_hf

    path, tokenizer_json = Path(path), Path(tokenizer_json)
    cfg = load_preset("tiny").replace(vocab_size=load_tokenizer(tokenizer_json).vocab_size)
    save_hf(path, init_params(cfg, key), cfg)
    (path / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    return path


def tiny_workspace(root: str | Path, *, seed: int = 0, docs: int = 400, questions: int = 24,
                   vocab_size: int = 1024) -> Workspace:
    """Build a tiny untrained workspace under `root` (module docstring); returns its paths."""
    import jax

    from searchjax.model import read_hf_config
    from searchjax.rewards.reward_model import init_reward_params, make_scorer, save_reward_model

    root = Path(root)
    tiny_data(root, seed=seed, docs=docs, questions=questions, vocab_size=vocab_size)
    key_policy, key_rm = jax.random.split(jax.random.key(seed))
    policy = tiny_policy(root / "policy", root / "tokenizer.json", key_policy)
    cfg = read_hf_config(policy)
    save_reward_model(root / "rm", init_reward_params(cfg, key_rm), make_scorer("pointwise", cfg))
    (root / "rm" / "tokenizer.json").write_bytes((root / "tokenizer.json").read_bytes())
    return Workspace(policy=policy, reference=policy, reward_model=root / "rm", index=root / "index",
                     prompts=(root / "qa.jsonl",), questions=root / "heldout.jsonl")


def workspace(pipeline_out: str | Path | None, root: str | Path) -> Workspace:
    """The pipeline output `pipeline_out` when it is given and exists, else a tiny workspace built under `root`."""
    if pipeline_out and Path(pipeline_out).exists():
        return pipeline_workspace(pipeline_out)
    return tiny_workspace(root)
