"""`searchjax pipeline`: stages run in order, an unchanged stage is skipped, a changed config reruns that stage and
the ones after it (and only those), --force reruns one stage, a failing stage names itself and its log."""

from __future__ import annotations

import dataclasses
import json

import pytest

from searchjax import pipeline
from searchjax.pipeline import RecipeConfig, StageError, load_recipe, run_pipeline, stage_hash, stages
from searchjax.config import ConfigError, configs_dir


def _statuses(report):
    return {name: r["status"] for name, r in report.items()}


def test_stage_skipping_and_rerun_on_a_config_change(tmp_path):
    cfg = RecipeConfig(world_docs=400, real_cities=20, vocab_size=400, questions=6)
    out = tmp_path / "run"
    first = run_pipeline(cfg, out, until="qa", log=lambda _: None)
    assert list(first) == ["world", "index", "qa"] and set(_statuses(first).values()) == {"ran"}
    for name in first:
        assert json.loads((out / name / "stage.json").read_text())["hash"]
    assert _statuses(run_pipeline(cfg, out, until="qa", log=lambda _: None)) == dict.fromkeys(first, "skipped")

    changed = dataclasses.replace(cfg, questions=5)  # only the qa stage reads it
    assert _statuses(run_pipeline(changed, out, until="qa", log=lambda _: None)) == {
        "world": "skipped", "index": "skipped", "qa": "ran"}
    forced = run_pipeline(changed, out, until="qa", force=("index",), log=lambda _: None)
    assert _statuses(forced) == {"world": "skipped", "index": "ran", "qa": "skipped"}

    reseeded = dataclasses.replace(changed, seed=1)  # the world changes, so everything after it reruns
    assert set(_statuses(run_pipeline(reseeded, out, until="qa", log=lambda _: None)).values()) == {"ran"}


def test_a_deleted_output_reruns_its_stage(tmp_path):
    cfg = RecipeConfig(world_docs=400, real_cities=20, vocab_size=400)
    out = tmp_path / "run"
    run_pipeline(cfg, out, until="tokenizer", log=lambda _: None)
    (out / "tokenizer" / "tokenizer.json").unlink()
    assert _statuses(run_pipeline(cfg, out, until="tokenizer", log=lambda _: None))["tokenizer"] == "ran"


def test_a_failing_stage_names_itself_and_its_log(tmp_path):
    cfg = RecipeConfig(world_docs=400, real_cities=20, vocab_size=10)  # below the special tokens: refused
    with pytest.raises(StageError, match=r"stage tokenizer failed .*log: .*tokenizer/log.txt"):
        run_pipeline(cfg, tmp_path / "run", until="tokenizer", log=lambda _: None)
    with pytest.raises(ValueError, match="unknown stage 'nope'"):
        run_pipeline(cfg, tmp_path / "run", until="nope")


def test_a_bad_training_override_fails_before_any_stage_runs(tmp_path):
    bad = RecipeConfig(world_docs=400, real_cities=20, vocab_size=400,
                       grpo=pipeline.TrainStage("configs/train/grpo_tiny.yaml", ("rollout.max_new_tokenz=9",)))
    with pytest.raises(ConfigError, match=r"stage grpo \(configs/train/grpo_tiny.yaml, overrides "
                                          r"\['rollout.max_new_tokenz=9'\]\):.*max_new_tokenz"):
        run_pipeline(bad, tmp_path / "run", log=lambda _: None)
    assert not (tmp_path / "run").exists()  # nothing ran, nothing written
    typed = dataclasses.replace(bad, grpo=pipeline.TrainStage("configs/train/grpo_tiny.yaml", ("steps=many",)))
    with pytest.raises(ConfigError, match="stage grpo .*steps"):
        run_pipeline(typed, tmp_path / "run", log=lambda _: None)
    # a stage after --until is not checked: it will not run
    assert _statuses(run_pipeline(bad, tmp_path / "run", until="world", log=lambda _: None)) == {"world": "ran"}


def test_the_pipeline_configs_load_and_chain_every_stage():
    for path in sorted((configs_dir() / "pipeline").glob("*.yaml")):
        cfg = load_recipe(path)
        pipeline.check_train_configs(cfg)  # every training stage's YAML + overrides, as its stage loads them
        names = [s.name for s in stages(cfg)]
        assert names[0] == "world" and names[-1] == "eval"
        for s in stages(cfg):
            assert all(a in names[: names.index(s.name)] for a in s.after), s.name


def _hashes(cfg):
    hashes = {}
    for st in stages(cfg):
        hashes[st.name] = stage_hash(st, hashes)
    return hashes


def test_hashes_do_not_depend_on_where_the_repository_is(monkeypatch, tmp_path):
    """The argv holds absolute paths of the config files; a clone elsewhere must still skip what is done."""
    here = _hashes(RecipeConfig())
    clone = tmp_path / "elsewhere" / "searchjax"
    for st in stages(RecipeConfig()):
        for rel in st.reads:  # the same config files, at the clone's location
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            (clone / rel).write_bytes((pipeline.repo_root() / rel).read_bytes())
    monkeypatch.setattr(pipeline, "repo_root", lambda: clone)
    assert any(str(clone) in a for st in stages(RecipeConfig()) for a in st.argv)  # the paths did move
    assert _hashes(RecipeConfig()) == here


def test_the_in_process_stage_hashes_only_the_fields_it_uses():
    base = _hashes(RecipeConfig())
    assert _hashes(RecipeConfig(eval_slots=3))["heldout"] == base["heldout"]  # only eval reads eval_slots
    assert _hashes(RecipeConfig(eval_slots=3))["eval"] != base["eval"]
    assert _hashes(RecipeConfig(eval_questions=3))["heldout"] != base["heldout"]


def test_an_interrupted_resumable_stage_resumes_and_any_other_starts_afresh(monkeypatch, tmp_path):
    """A stage killed half-way runs again on the next start: a resumable one (training, evaluation) in the
    directory it left, so its command continues from its checkpoints; a changed hash or a plain stage starts from
    an empty directory."""
    calls, failed = [], []

    def work(name, fail_once):
        def run(out):
            d = out / name
            calls.append((name, sorted(p.name for p in d.iterdir())))
            (d / "partial").write_text("progress")
            if fail_once and not failed:
                failed.append(name)
                raise RuntimeError("killed")
            (d / "done").write_text("ok")
        return run

    def fake_stages(cfg):
        return [pipeline.Stage("plain", (), produces=("plain/done",), run=work("plain", False),
                               params=(("n", cfg.questions),)),
                pipeline.Stage("train", ("plain",), produces=("train/done",), run=work("train", True),
                               params=(("n", cfg.eval_slots),), resumable=True)]

    monkeypatch.setattr(pipeline, "stages", fake_stages)
    cfg = RecipeConfig()
    with pytest.raises(RuntimeError):
        run_pipeline(cfg, tmp_path, log=lambda _: None)
    assert calls == [("plain", []), ("train", ["attempt.json"])]
    assert _statuses(run_pipeline(cfg, tmp_path, log=lambda _: None)) == {"plain": "skipped", "train": "resumed"}
    assert calls[-1] == ("train", ["attempt.json", "partial"])  # the interrupted run's files kept
    assert not (tmp_path / "train" / "attempt.json").exists() and (tmp_path / "train" / "stage.json").exists()

    calls.clear()
    (tmp_path / "train" / "stage.json").unlink()  # interrupted again, and now with another config
    (tmp_path / "train" / "attempt.json").write_text(json.dumps({"hash": "another"}))
    assert _statuses(run_pipeline(cfg, tmp_path, log=lambda _: None))["train"] == "ran"
    assert calls == [("train", ["attempt.json"])]  # started from an empty directory


def test_an_induction_phase_sits_between_base_init_and_lm_and_lm_starts_from_it():
    plain = {st.name: st for st in stages(RecipeConfig())}
    assert "induction" not in plain and "{OUT}/base_init/model" in plain["lm"].argv
    cfg = RecipeConfig(induction=pipeline.TrainStage("configs/train/lm_tiny.yaml", ("steps=5",)))
    names = [st.name for st in stages(cfg)]
    assert names.index("base_init") < names.index("induction") < names.index("lm")
    by = {st.name: st for st in stages(cfg)}
    assert by["lm"].after[0] == "induction" and "{OUT}/induction/run/final" in by["lm"].argv
    assert by["induction"].argv[:3] == ("searchjax", "train", "lm") and "steps=5" in by["induction"].argv
    assert "{OUT}/induction/run" in by["induction"].argv and by["induction"].resumable
    assert _hashes(cfg)["lm"] != _hashes(RecipeConfig())["lm"]  # lm reads another start, so it reruns
    assert _hashes(cfg)["base_init"] == _hashes(RecipeConfig())["base_init"]
    assert set(pipeline.STAGE_NAMES) == set(names)  # --until / --force accept the optional stage
