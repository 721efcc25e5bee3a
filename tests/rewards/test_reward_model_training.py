"""`searchjax train rm` (searchjax.train.reward_model): the symmetric loss learns a toy preference, the backbone
freeze, the length-bucketed pair batches, and the stage end to end (run directory, metrics, HF export, serving)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.rewards.reward_model import PairTemplate, PairwiseScorer, PointwiseScorer, from_policy
from searchjax.testing.models import tiny_model
from searchjax.train.config import OptimConfig
from searchjax.train.optim import make_optimizer
from searchjax.train.reward_model import PairBatches, encode_pairs, pad_pairs, symmetric_loss
from searchjax.train.state import create_state
from searchjax.train.step import make_train_step
from searchjax.sharding import make_mesh


def char_encode(text: str) -> list[int]:
    return [1 + ord(c) % 255 for c in text]


def toy_batch(scorer, seed: int, n: int = 8, width: int = 192) -> dict[str, np.ndarray]:
    """Pairs of random prompts whose chosen answer ends in token 7 and rejected one in token 9 (else the same),
    laid out in the scorer's two rows."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        x = list(rng.integers(10, 200, rng.integers(4, 12)))
        body = list(rng.integers(10, 200, rng.integers(2, 8)))
        rows = scorer.rows(x, body + [7], body + [9], scorer.template)
        pairs.append({"rows": [np.array([i for piece in r for i in piece]) for r in rows], "label": 1.0})
        if scorer.likelihood:  # the responses are the assistant's
            ones = [1] * (len(body) + 1)
            pairs[-1]["masks"] = [np.array(m) for m in scorer.mask_rows(len(x), ones, ones)]
    return {**pad_pairs(pairs, width, 0), "freeze": np.zeros((n,), bool)}


_STEPS: dict = {}


def train(scorer, params, batches, *, steps: int, freeze: bool = False):
    """`steps` optimizer steps of the symmetric loss (constant lr 3e-3, no weight decay); one compiled step per
    scorer, shared by the tests (the freeze flag travels in the batch)."""
    if scorer not in _STEPS:
        tx = make_optimizer(OptimConfig(learning_rate=3e-3, schedule="constant", weight_decay=0.0), 100)
        _STEPS[scorer] = tx, make_train_step(symmetric_loss(scorer, remat=False, aux_coef=0.0), tx)
    tx, step = _STEPS[scorer]
    mesh = make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
    state = create_state(params, tx, 0, mesh, jax.tree.map(lambda p: p.sharding, params))
    history = []
    for t in range(steps):
        batch = {k: jnp.asarray(v) for k, v in batches[t % len(batches)].items()}
        batch["freeze"] = jnp.full_like(batch["freeze"], freeze)
        state, metrics = step(state, batch)
        history.append({k: float(v) for k, v in metrics.items()})
    return state, history


@pytest.fixture(scope="module")
def start():
    cfg, policy = tiny_model("tiny", seed=0)
    return cfg, from_policy(policy, cfg)


def test_symmetric_loss_falls_on_a_learnable_toy_set(start):
    cfg, params = start
    scorer = PairwiseScorer(cfg, PairTemplate.from_encoder(char_encode))
    _, history = train(scorer, params, [toy_batch(scorer, s) for s in range(4)], steps=40)
    first, last = np.mean([h["rm/loss"] for h in history[:4]]), np.mean([h["rm/loss"] for h in history[-4:]])
    assert history[0]["rm/loss"] == pytest.approx(np.log(2), abs=1e-4)  # the zero head starts at Δ = 0
    assert last < 0.3 * first, (first, last)
    assert np.mean([h["rm/accuracy"] for h in history[-4:]]) == 1.0
    assert history[-1]["rm/margin"] > 1.0 and history[-1]["rm/position_bias"] >= 0.0


def test_backbone_freeze_trains_the_head_only(start):
    cfg, params = start
    # The toy test's scorer, so its compiled step serves here too (the pointwise scorer trains end to end below).
    scorer = PairwiseScorer(cfg, PairTemplate.from_encoder(char_encode))
    frozen, _ = train(scorer, params, [toy_batch(scorer, 0)], steps=3, freeze=True)
    chex_equal = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), frozen.params.backbone, params.backbone)
    assert all(jax.tree.leaves(chex_equal)), "a frozen backbone must not move"
    assert not jnp.array_equal(frozen.params.head, params.head)
    free, _ = train(scorer, params, [toy_batch(scorer, 0)], steps=3)
    moved = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), free.params.backbone, params.backbone)
    assert not all(jax.tree.leaves(moved))


@pytest.mark.parametrize("kind", ["pointwise", "pairwise"])
def test_likelihood_term_trains_beta_under_the_freeze_and_learns_the_toy_set(kind):
    cfg, policy = tiny_model("tiny", seed=0)
    params = from_policy(policy, cfg, likelihood=True)
    scorer = (PointwiseScorer(cfg, likelihood=True) if kind == "pointwise"
              else PairwiseScorer(cfg, PairTemplate.from_encoder(char_encode), likelihood=True))

    batches = [toy_batch(scorer, s) for s in range(4)]
    frozen, _ = train(scorer, params, batches[:1], steps=3, freeze=True)
    same = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), frozen.params.backbone, params.backbone)
    assert all(jax.tree.leaves(same)), "a frozen backbone (its LM head included) must not move"
    assert float(frozen.params.likelihood_weight) != 0.0, "β learns with the head"
    _, history = train(scorer, params, batches, steps=40)
    first, last = np.mean([h["rm/loss"] for h in history[:4]]), np.mean([h["rm/loss"] for h in history[-4:]])
    assert history[0]["rm/loss"] == pytest.approx(np.log(2), abs=1e-4) and last < 0.5 * first, (first, last)


def test_pair_batches_bucket_shuffle_and_flag_the_frozen_steps():
    import grain

    from searchjax.data.pipeline import EpochShuffle

    rng = np.random.default_rng(0)
    pairs = [{"rows": [np.arange(n, dtype=np.int32) + 1, np.arange(n + 3, dtype=np.int32) + 1], "label": 1.0,
              "id": str(i)} for i, n in enumerate(rng.integers(5, 120, 24))]
    ds = PairBatches(EpochShuffle(grain.MapDataset.source(pairs), seed=1), batch_pairs=4, window_batches=3,
                     buckets=(32, 64, 128), pad_id=0, seed=1, freeze_steps=5)
    seen = []
    for k in range(6):  # one epoch: 24 pairs in 6 batches of 4
        b = ds[k]
        assert b["tokens"].shape[:2] == (4, 2) and b["tokens"].shape[2] in (32, 64, 128)
        assert b["lengths"].max() <= b["tokens"].shape[2] and b["tokens"].shape[2] // 2 < max(b["lengths"].max(), 33)
        assert b["freeze"].tolist() == [k < 5] * 4
        seen += [int(n) for n in b["lengths"][:, 0]]
    assert sorted(seen) == sorted(len(p["rows"][0]) for p in pairs)
    np.testing.assert_array_equal(ds[3]["tokens"], ds[3]["tokens"])
    assert not ds[7]["freeze"].any()


def test_encode_pairs_names_a_pair_past_the_largest_bucket():
    from searchjax.data.jsonl import DataError

    cfg, _ = tiny_model("tiny", seed=0)
    rec = {"id": "long-1", "category": "c", "prompt": [{"role": "user", "content": "q" * 300}],
           "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]}
    with pytest.raises(DataError, match="pair 'long-1' has a row of 3.. tokens, more than the largest bucket 256"):
        encode_pairs([rec], PointwiseScorer(cfg), char_encode, 256)
    kept, dropped = encode_pairs([rec], PointwiseScorer(cfg), char_encode, 256, overflow="drop")
    assert kept == [] and dropped == 1


@pytest.mark.slow
def test_train_rm_end_to_end(tmp_path, capsys):
    """World → QA → preference pairs → `searchjax train rm` → RUN/final loads, scores, and serves."""
    from searchjax.chat import train_tokenizer
    from searchjax.cli.main import main
    from searchjax.data.jsonl import write_jsonl
    from searchjax.data.preferences import PreferenceBuilder, PreferenceConfig, RubricJudge, RuleJudge, \
        judge_and_filter
    from searchjax.data.rubric_data import generate_rubric_records
    from searchjax.data.solvers import SearchSolver
    from searchjax.data.synth import QAGenerator, SynthConfig
    from searchjax.model import init_params, load_preset, save_hf
    from searchjax.rewards.reward_model import load_reward_model
    from searchjax.rollout.preference import PreferenceScorer
    from searchjax.search import TantivyBackend, build_index
    from searchjax.search.world import KnowledgeBase, build_world

    build_world(tmp_path / "world", seed=0, n_docs=300, n_real_cities=20, progress=False)
    build_index(tmp_path / "world" / "corpus.jsonl", tmp_path / "index", progress=False)
    kb, backend = KnowledgeBase.load(tmp_path / "world"), TantivyBackend(tmp_path / "index")
    qa = list(QAGenerator(kb, SearchSolver(backend), SynthConfig(n=24, seed=0, max_hops=2)).generate())
    short = ("format", "language", "concise")  # rows of a few hundred tokens: one bucket, one compile
    pairs = list(PreferenceBuilder(kb, backend, PreferenceConfig(categories=short, pairs_per_category=24,
                                                                  dev_fraction=0.25)).build(
        qa, generate_rubric_records(18, seed=0)))
    kept, _ = judge_and_filter(pairs, [RuleJudge(), RubricJudge()], 2)
    write_jsonl(tmp_path / "prefs.jsonl", kept)
    tok = train_tokenizer([tmp_path / "world" / "corpus.jsonl"], 1024, tmp_path / "tokenizer.json")
    cfg = load_preset("tiny").replace(vocab_size=tok.vocab_size)
    save_hf(tmp_path / "policy", init_params(cfg, jax.random.key(0)), cfg)
    (tmp_path / "policy" / "tokenizer.json").write_bytes((tmp_path / "tokenizer.json").read_bytes())

    run = tmp_path / "run"
    args = ["train", "rm", "--config", "configs/train/rm_tiny.yaml", "--model", str(tmp_path / "policy"),
            "--data", str(tmp_path / "prefs.jsonl"), "--out", str(run), "steps=6", "batch_size=4",
            "freeze_backbone_steps=2", "log_every=2", "eval_every=6", "save_every=6", "progress=false",
            "data.buckets=[512]", "data.window_batches=2", "scorer=pairwise"]
    assert main(args) == 0, capsys.readouterr().err
    summary = json.loads((run / "summary.json").read_text())
    last = summary["last_metrics"]
    for key in ("rm/loss", "rm/accuracy", "rm/margin", "rm/position_bias", "dev/rm/accuracy",
                "dev/rm/position_bias", *(f"dev/accuracy/{c}" for c in short)):
        assert key in last, key
    assert 0.0 <= last["dev/rm/accuracy"] <= 1.0 and last["dev/rm/position_bias"] > 0.0  # pairwise: order matters
    params, scorer = load_reward_model(run / "final")
    assert scorer.kind == "pairwise" and scorer.cfg.pad_token_id == tok.special.pad
    served = PreferenceScorer.load(run / "final", batch_pairs=2, buckets=(512,))
    r = kept[0]
    p = served.score([r["prompt"]] * 2, [r["chosen"], r["rejected"]], [r["rejected"], r["chosen"]])
    assert p[0] + p[1] == np.float32(1.0)
    assert main(["serve-rm", "--model", str(tmp_path / "policy")]) == 1
    assert "not a reward model checkpoint" in capsys.readouterr().err


def test_shipped_config_loads_and_checks_the_freeze(tmp_path):
    from searchjax.config import ConfigError, configs_dir
    from searchjax.train.config import load_train_config
    from searchjax.train.reward_model import RMConfig

    cfg = load_train_config(RMConfig, configs_dir() / "train" / "rm_tiny.yaml")
    assert cfg.scorer == "pointwise" and 0 < cfg.freeze_backbone_steps < cfg.steps
    assert cfg.checkpoint.best_metric == "dev/rm/accuracy"
    pairwise = load_train_config(RMConfig, configs_dir() / "train" / "rm_tiny.yaml", ["scorer=pairwise"])
    assert pairwise.scorer == "pairwise"
    with pytest.raises(ConfigError, match="freeze_backbone_steps must be in"):
        load_train_config(RMConfig, configs_dir() / "train" / "rm_tiny.yaml", ["freeze_backbone_steps=9999"])
    with pytest.raises(ConfigError, match="scorer"):
        load_train_config(RMConfig, configs_dir() / "train" / "rm_tiny.yaml", ["scorer=listwise"])
