"""The GRPO stage: base rewards by data kind, the reference cache, the training batch, the loss with temperature,
the config's refusals and ablation switches; end to end on the tiny preset (metrics, canary, sync without
recompiling, export) and kill -9 resume with the same metrics."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.config import ConfigError
from searchjax.data.jsonl import DataError
from searchjax.rewards.aggregate import RolloutRecords, compute_rewards
from searchjax.rewards.config import RewardConfig
from searchjax.rewards.rubrics import RuleJudge
from searchjax.rollout.records import RolloutRecord
from searchjax.train.config import load_train_config
from searchjax.train.grpo import (GRPOConfig, GRPOLoop, load_prompts, mixed_groups, preference_scored,
                                  prompt_iterator, prompt_sources, select_groups, with_prompts)
from searchjax.train.rl import (ReferenceCache, RLPrompt, base_reward, grpo_loss_fn, old_logprobs_fn,
                                train_arrays, width_bucket)
from tests.train.conftest import read_metrics

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "train" / "grpo_tiny.yaml"
QA = {"id": "q1", "question": "Who wrote The Mom Test?", "answer": "Rob Fitzpatrick", "aliases": ["R. Fitzpatrick"]}
RUBRIC = {"id": "r1", "messages": [{"role": "user", "content": "Say hello in one line."}], "reference": "Hello!",
          "rubrics": [{"text": "says hello", "kind": "contains", "params": {"all": ["hello"]}}]}


def _record(answer="", finish="answer", prompt_id="q1", index=0, tokens=(5, 6, 7, 8, 9), prompt_length=2,
            logprobs=None) -> RolloutRecord:
    n = len(tokens)
    mask = [0] * prompt_length + [1] * (n - prompt_length)
    lp = logprobs or [0.0] * prompt_length + [-0.5] * (n - prompt_length)
    return RolloutRecord(prompt_id=prompt_id, group_index=index, tokens=list(tokens), loss_mask=mask, logprobs=lp,
                         prompt_length=prompt_length, tool_calls=0, tool_failures=0, response_length=sum(mask),
                         answer=answer, finish_reason=finish)


# ------------------------------------------------------------------------------------------- host pieces
@pytest.mark.parametrize("kind,record,answer,finish,expected", [
    ("qa", QA, "The answer is Rob Fitzpatrick.", "answer", 1.0),
    ("qa", QA, "R. Fitzpatrick", "answer", 1.0),
    ("qa", QA, "The answer is Eric Ries.", "answer", 0.0),
    ("qa", QA, "The answer is Rob Fitzpatrick.", "max_tokens", 0.0),  # cut short: no final answer
    ("rubric", RUBRIC, "Hello there!", "answer", 1.0),
    ("rubric", RUBRIC, "Good morning.", "answer", 0.0),
])
def test_base_reward_routes_by_data_kind(kind, record, answer, finish, expected):
    prompt = RLPrompt.of(record, kind, budget=3)
    assert base_reward(_record(answer, finish, prompt.prompt_id), prompt, RewardConfig(), RuleJudge()) == expected


def test_prompt_sources_detect_kinds_and_use_the_recipe_mix(tmp_path):
    qa, rub = tmp_path / "qa.jsonl", tmp_path / "rub.jsonl"
    qa.write_text(json.dumps(QA) + "\n")
    rub.write_text(json.dumps(RUBRIC) + "\n")
    sources = prompt_sources([str(qa), str(rub)])
    assert [(s.kind, s.weight) for s in sources] == [("qa", 0.9), ("rubric", pytest.approx(0.1))]
    assert [s.weight for s in prompt_sources([str(qa), str(qa)])] == [0.5, 0.5]


def test_qa_hops_keeps_the_asked_hop_counts_and_names_rows_without_one(tmp_path):
    qa, rub, bare = tmp_path / "qa.jsonl", tmp_path / "rub.jsonl", tmp_path / "bare.jsonl"
    rows = [{**QA, "id": f"q{h}", "hops": h, "split": "train"} for h in (2, 3, 4, 3)]
    qa.write_text("".join(json.dumps(r) + "\n" for r in rows + [{**QA, "id": "dev2", "hops": 2, "split": "dev"}]))
    rub.write_text(json.dumps(RUBRIC) + "\n")
    bare.write_text(json.dumps(QA) + "\n")
    cfg = load_train_config(GRPOConfig, CONFIG, ["data.qa_hops=[2,3]"])
    qa_rows, rubric_rows = load_prompts(with_prompts(cfg, [str(qa), str(rub)]))
    assert [r["id"] for r in qa_rows] == ["q2", "q3", "q3"] and rubric_rows == [RUBRIC]  # rubric rows untouched
    assert len(load_prompts(with_prompts(load_train_config(GRPOConfig, CONFIG), [str(qa)]))[0]) == 4
    with pytest.raises(DataError, match="bare.jsonl: data.qa_hops is set but 1 rows have no integer `hops`"):
        load_prompts(with_prompts(cfg, [str(bare)]))
    with pytest.raises(DataError, match=r"no 'train' prompts with hops in \[5\]"):
        load_prompts(with_prompts(load_train_config(GRPOConfig, CONFIG, ["data.qa_hops=[5]"]), [str(qa)]))
    with pytest.raises(ConfigError, match="qa_hops must be hop counts >= 1"):
        load_train_config(GRPOConfig, CONFIG, ["data.qa_hops=[0]"])


def _hops_of(batches):
    return [[(i, r.get("hops")) for i, r in batch] for batch in batches]


def test_stratify_hops_gives_every_hop_count_an_equal_share_in_turn_and_resumes(tmp_path):
    qa, rub, bare = tmp_path / "qa.jsonl", tmp_path / "rub.jsonl", tmp_path / "bare.jsonl"
    rows = [{**QA, "id": f"q{n}", "hops": 2 if n < 2 else 3, "split": "train"} for n in range(8)]  # 2 of 8 2-hop
    qa.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rub.write_text(json.dumps(RUBRIC) + "\n")
    bare.write_text(json.dumps(QA) + "\n")
    plain = with_prompts(load_train_config(GRPOConfig, CONFIG, ["batch_size=4"]), [str(qa)])
    strat = dataclasses.replace(plain, data=dataclasses.replace(plain.data, stratify="hops"))
    it = prompt_iterator(plain, load_prompts(plain))
    drawn = [h for b in _hops_of(next(it) for _ in range(4)) for _, h in b]
    assert drawn.count(2) == 4  # one pool: two epochs of 8 rows hold 2-hop rows 4 times
    it = prompt_iterator(strat, load_prompts(strat))
    batches = _hops_of(next(it) for _ in range(6))
    assert all(sorted(h for _, h in b) == [2, 2, 3, 3] and {i for i, _ in b} == {0} for b in batches), batches
    state = it.get_state()
    after = _hops_of(next(it) for _ in range(3))
    again = prompt_iterator(strat, load_prompts(strat))
    again.set_state(state)
    assert _hops_of(next(again) for _ in range(3)) == after  # a resumed run draws the same prompts

    both = with_prompts(strat, [str(qa), str(rub)])  # QA 0.9 split into 0.45 + 0.45, rubric 0.1
    it = prompt_iterator(both, load_prompts(both))
    drawn = [p for b in _hops_of(next(it) for _ in range(20)) for p in b]
    assert (drawn.count((0, 2)), drawn.count((0, 3)), drawn.count((1, None))) == (36, 36, 8)
    with pytest.raises(DataError, match="bare.jsonl: data.stratify is 'hops' but 1 rows have no integer `hops`"):
        load_prompts(with_prompts(strat, [str(bare)]))
    with pytest.raises(ConfigError, match="stratify"):
        load_train_config(GRPOConfig, CONFIG, ["data.stratify=hop"])


def test_reference_cache_pairs_by_index_and_round_trips():
    cache = ReferenceCache(2)
    recs = [_record("b", index=1, tokens=(5, 6, 1, 2, 3)), _record("a", index=0, tokens=(5, 6, 4))]
    cache.add_records(recs)
    assert [r.answer for r in cache["q1"]] == ["a", "b"]
    assert cache["q1"][1].response == (1, 2, 3) and cache["q1"][1].length == 3
    again = ReferenceCache.from_json(json.loads(json.dumps(cache.to_json())))
    assert again.entries == cache.entries
    with pytest.raises(ValueError, match="1 of 2"):
        ReferenceCache(2).add_records([_record(prompt_id="q2")])


def test_shared_reference_cache_gives_the_group_one_reference():
    """rollout.reference=shared: one record (group_index −1) per prompt, returned for every index i, so every
    L_j^ref of the group is L_ref (b_win = b_lose = L_ref); paired records are refused, and the flag survives JSON."""
    cache = ReferenceCache(3, shared=True)
    cache.add_records([_record("a", index=-1, tokens=(5, 6, 1, 2))])
    assert [r.answer for r in cache["q1"]] == ["a"] * 3 and {r.length for r in cache["q1"]} == {2}
    again = ReferenceCache.from_json(json.loads(json.dumps(cache.to_json())))
    assert again.shared and again["q1"] == cache["q1"] and len(again.entries["q1"]) == 1
    with pytest.raises(ValueError, match="shared reference rollout"):
        ReferenceCache(3, shared=True).add_records([_record(prompt_id="q2", index=0)])
    with pytest.raises(ValueError, match="paired reference rollout"):
        ReferenceCache(3).add_records([_record(prompt_id="q2", index=-1)])
    with pytest.raises(ValueError, match="expected shared: 1"):
        ReferenceCache(3, {"q": cache["q1"]}, shared=True)
    assert not ReferenceCache.from_json({"group_size": 1, "entries": {}}).shared  # caches saved before the switch


def test_mixed_groups_are_those_with_some_right_and_some_wrong():
    r_base = np.asarray([[1, 0, 0], [1, 1, 1], [0, 0, 0], [0, 0, 1]], np.float32)
    assert mixed_groups(r_base).tolist() == [True, False, False, True]


def test_select_groups_takes_mixed_groups_first_and_fills_from_the_earliest_draws():
    draws = [np.asarray([False, True, False]), np.asarray([True, False, False]), np.asarray([False, True, True])]
    assert select_groups(draws, 3) == [(0, 1), (1, 0), (2, 1)]
    assert select_groups(draws, 4) == [(0, 1), (1, 0), (2, 1), (2, 2)]
    assert select_groups(draws[:2], 3) == [(0, 0), (0, 1), (1, 0)]  # two mixed; the first unmixed fills
    with pytest.raises(ValueError, match="4 groups asked of draws holding 3"):
        select_groups(draws[:1], 4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=1, max_size=4), st.integers(1, 3))
def test_select_groups_keeps_every_mixed_group_it_can(masks, n):
    mixed = [np.asarray(m) for m in masks]
    keep = select_groups(mixed, n)
    assert len(keep) == n == len(set(keep)) and keep == sorted(keep)
    found = sum(int(m.sum()) for m in mixed)
    assert sum(bool(mixed[d][i]) for d, i in keep) == min(n, found)


def test_preference_scored_only_when_r_depends_on_s():
    assert preference_scored(RewardConfig())
    assert preference_scored(RewardConfig(aggregation="linear", linear_weight=0.5))
    assert not preference_scored(RewardConfig(aggregation="linear", linear_weight=0.0))


class _Policy:
    """Rollouts whose answers follow the prompt id: "right" all correct, "wrong" none, "mixed" the first."""

    def __init__(self):
        self.calls = []

    def rollouts(self, items, g, key):
        self.calls.append([it.prompt_id for it in items])
        gold = QA["answer"]
        return [_record(answer=gold if it.prompt_id.startswith("right") or (it.prompt_id.startswith("mixed") and i == 0)
                        else "no idea", prompt_id=it.prompt_id, index=i) for it in items for i in range(g)]


def _filter_loop(batches, max_draws):
    from types import SimpleNamespace

    from searchjax.data.pipeline import SourceConfig

    cfg = load_train_config(GRPOConfig, CONFIG, ["batch_size=2", "rollout.group_size=2", "optim.micro_batches=1",
                                                 "filter_groups=true", f"filter_max_draws={max_draws}"])
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(
        cfg.data, sources=(SourceConfig(name="qa0", path="unused", kind="qa", weight=1.0),)))
    loop = object.__new__(GRPOLoop)
    loop.cfg, loop.root_key = cfg, jax.random.key(0)
    loop.actors = SimpleNamespace(policy=_Policy(), judge=RuleJudge())
    loop.iterator = iter([[(0, {**QA, "id": i}) for i in batch] for batch in batches])
    return loop


def test_filter_draws_until_the_batch_holds_mixed_groups():
    """Dynamic sampling: batches are drawn until N = 2 mixed groups are found; the kept groups are those, with
    their own rollouts and r_base; a prompt drawn twice in one step gets its own id."""
    import collections

    loop = _filter_loop([["right", "mixed1"], ["wrong", "mixed1"], ["mixed3", "right"]], max_draws=4)
    first = loop.prompts(next(loop.iterator), ids := collections.Counter())
    kept, (groups, r_base, _), m, tokens = loop.draw(first, 0, ids)
    assert [p.prompt_id for p in kept] == ["mixed1", "mixed1#1"] == list(groups.prompt_ids)
    assert loop.actors.policy.calls == [["right", "mixed1"], ["wrong", "mixed1#1"]]  # the third batch not drawn
    assert r_base.tolist() == [[1.0, 0.0], [1.0, 0.0]]
    assert [[r.prompt_id for r in row] for row in groups.grid] == [["mixed1"] * 2, ["mixed1#1"] * 2]
    assert m == {"filter/draws": 2.0, "filter/frac_mixed_drawn": 0.5, "filter/filled": 0.0}
    assert tokens == 8 * 3  # every drawn rollout's 3 response tokens


def test_filter_stops_at_max_draws_and_fills_with_unmixed_groups():
    import collections

    loop = _filter_loop([["right", "wrong"], ["mixed", "right2"], ["mixed9", "x"]], max_draws=2)
    first = loop.prompts(next(loop.iterator), ids := collections.Counter())
    kept, (groups, r_base, _), m, _ = loop.draw(first, 0, ids)
    assert [p.prompt_id for p in kept] == ["right", "mixed"]  # the mixed group, then the first unmixed one
    assert r_base.tolist() == [[1.0, 1.0], [1.0, 0.0]]
    assert m == {"filter/draws": 2.0, "filter/frac_mixed_drawn": 0.25, "filter/filled": 1.0}


def test_train_arrays_shift_tokens_mask_and_logprobs():
    rec = _record(tokens=(5, 6, 7, 8), prompt_length=2, logprobs=[0.0, 0.0, -0.1, -0.2])
    arr = train_arrays([rec, _record(tokens=(5, 6, 7))], np.asarray([1.5, -1.5]), pad_id=0, buckets=(4, 8))
    assert arr["input_ids"].shape == (2, 4)
    np.testing.assert_array_equal(arr["input_ids"][0], [5, 6, 7, 0])
    np.testing.assert_array_equal(arr["targets"][0], [6, 7, 8, 0])
    np.testing.assert_array_equal(arr["loss_mask"][0], [0, 1, 1, 0])
    np.testing.assert_allclose(arr["logp_infer"][0], [0.0, -0.1, -0.2, 0.0])
    np.testing.assert_array_equal(arr["lengths"], [3, 2])
    np.testing.assert_array_equal(arr["advantages"], [1.5, -1.5])
    assert width_bucket(5, (4, 8)) == 8
    with pytest.raises(ValueError, match="largest training bucket"):
        width_bucket(9, (4, 8))


def test_loss_log_probs_use_the_sampling_temperature():
    """log π_T of the loss = log_softmax(logits / T) at the targets (from full logits, as a check)."""
    from searchjax import model as M

    cfg = M.load_preset("tiny").replace(vocab_size=257)
    params = M.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 257, (2, 12)), jnp.int32)
    targets = jnp.roll(ids, -1, axis=1)
    t = 0.6
    logits = M.forward(params, ids, cfg)
    want = jnp.take_along_axis(jax.nn.log_softmax(logits / t, axis=-1), targets[..., None], -1)[..., 0]
    mask = jnp.ones((2, 12), jnp.int32).at[:, :3].set(0)
    batch = {"input_ids": ids, "targets": targets, "loss_mask": mask, "logp_infer": jnp.where(mask > 0, want, 0.0),
             "advantages": jnp.asarray([1.0, -1.0]), "lengths": jnp.asarray([12, 12])}
    _, m = grpo_loss_fn(cfg, RewardConfig(), temperature=t, chunk=64)(params, batch, None)
    assert float(m["canary/logp_abs_diff_max"]) <= 1e-5
    assert float(m["rollout_corr/ess"]) == pytest.approx(1.0, abs=1e-6)
    _, m1 = grpo_loss_fn(cfg, RewardConfig(), temperature=1.0, chunk=64)(params, batch, None)
    assert float(m1["canary/logp_abs_diff_max"]) > 1e-2  # T = 1 is not the distribution sampled from


def test_routing_replay_follows_the_engines_experts():
    """The engine sent token 5 of row 0 to another expert than the trainer's router picks (as a router near-tie
    broken differently does): without replay every later log π moves and the canary fires; with replay the
    trainer routes as the engine did and the canary holds; route_mismatch counts the disagreement either way."""
    from searchjax import model as M

    cfg = M.load_preset("tiny").replace(vocab_size=257)
    params = M.init_params(cfg, jax.random.key(0))
    ids = jnp.asarray(np.random.default_rng(1).integers(0, 257, (2, 12)), jnp.int32)
    targets = jnp.roll(ids, -1, axis=1)
    own = M.forward(params, ids, cfg, return_aux=True)[1]["routes_own"]
    engine_routes = np.asarray(own).copy()
    used = set(engine_routes[0, 5, 0].tolist())  # token 5's experts in layer 0: one of them replaced
    engine_routes[0, 5, 0, 0] = next(e for e in range(cfg.num_experts) if e not in used)
    logits = M.forward(params, ids, cfg, routes=jnp.asarray(engine_routes))
    mu = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), targets[..., None], -1)[..., 0]
    mask = jnp.ones((2, 12), jnp.int32).at[:, :3].set(0)
    batch = {"input_ids": ids, "targets": targets, "loss_mask": mask, "logp_infer": jnp.where(mask > 0, mu, 0.0),
             "advantages": jnp.asarray([1.0, -1.0]), "lengths": jnp.asarray([12, 12]),
             "routes": jnp.asarray(engine_routes, jnp.int16)}
    _, off = grpo_loss_fn(cfg, RewardConfig(), temperature=1.0, chunk=64)(params, batch, None)
    _, on = grpo_loss_fn(cfg, RewardConfig(), temperature=1.0, chunk=64, replay=True)(params, batch, None)
    assert float(off["canary/logp_abs_diff_max"]) > 1e-4
    assert float(on["canary/logp_abs_diff_max"]) <= 1e-5
    share = 1 / (12 * 2 * cfg.num_hidden_layers)  # one (position, layer) pair of the 24 valid positions × layers
    assert float(off["rollout_corr/route_mismatch"]) == pytest.approx(share)
    assert float(on["rollout_corr/route_mismatch"]) == pytest.approx(share)
    # Row 1 has no mismatch: the canary over the rows routed alike holds without replay too.
    assert float(off["canary/logp_abs_diff_max_same_routes"]) <= 1e-5
    old = old_logprobs_fn(cfg, temperature=1.0, chunk=64, replay=True)(params, batch)
    np.testing.assert_allclose(np.asarray(old), np.asarray(batch["logp_infer"]), atol=1e-5)
    with pytest.raises(ValueError, match="no routes"):
        grpo_loss_fn(cfg, RewardConfig(), temperature=1.0, chunk=64, replay=True)(
            params, {k: v for k, v in batch.items() if k != "routes"}, None)


@pytest.mark.parametrize("override,message", [
    ("rollout.top_p=0.9", "top_p / top_k"),
    ("rollout.top_k=20", "top_p / top_k"),
    ("rollout.temperature=0", "temperature must be > 0"),
    ("rollout.group_size=1", "group_size must be >= 2"),
    ("minibatches=3", "minibatches"),
    ("data.buckets=[512]", "must reach rollout.max_len"),
    ("advantage_balance=hop", r"advantage_balance: expected one of \['none', 'hops'\], got 'hop'"),
    ("balance_max_scale=0", "balance_max_scale: expected > 0"),
    ("filter_max_draws=0", "filter_max_draws: expected >= 1"),
])
def test_config_refuses_what_rl_cannot_train(override, message):
    with pytest.raises(ConfigError, match=message):
        load_train_config(GRPOConfig, CONFIG, [override])


def test_a_minibatch_that_does_not_split_over_the_processes_is_refused():
    """N·G / minibatches rollouts per optimizer step, split over the processes: a remainder is an error naming the
    sizes (it used to drop rollouts silently)."""
    from searchjax.train.grpo import check_process_split

    cfg = load_train_config(GRPOConfig, CONFIG, ["batch_size=3", "rollout.group_size=2", "optim.micro_batches=1"])
    check_process_split(cfg, 2)  # 6 rollouts over 2 processes
    with pytest.raises(ConfigError, match=r"3 · 2 / 1 = 6 rollouts, not a multiple of the 4 processes"):
        check_process_split(cfg, 4)


def _switch(cfg: RewardConfig, batch: RolloutRecords):
    return compute_rewards(batch, cfg, jax.random.key(0))


@pytest.mark.parametrize("override", ["rewards.aggregation=linear", "rewards.penalties=unconditional",
                                      "rewards.normalize_std=false"])
def test_ablation_switches_change_the_reward_as_their_formula_says(override):
    cfg = load_train_config(GRPOConfig, CONFIG, [override]).rewards
    base = load_train_config(GRPOConfig, CONFIG).rewards
    rng = np.random.default_rng(1)
    batch = RolloutRecords(correct=np.asarray([[1, 0, 1, 0]], np.float32), preference=rng.uniform(size=(1, 4)),
                           calls=np.asarray([[1, 2, 3, 0]], np.float32), failures=np.zeros((1, 4), np.float32),
                           lengths=np.asarray([[10, 20, 30, 40]], np.float32),
                           ref_lengths=np.full((1, 4), 25.0, np.float32), mask=np.ones((1, 4), bool))
    got, ref = _switch(cfg, batch), _switch(base, batch)
    pen = np.asarray(got.efficiency_penalty)
    if "linear" in override:
        want = batch.correct + cfg.linear_weight * batch.preference - pen
        np.testing.assert_allclose(got.reward, want, rtol=1e-6)
        assert not np.allclose(got.reward, ref.reward)
    elif "unconditional" in override:
        np.testing.assert_allclose(got.tool_penalty, cfg.per_call * batch.calls, rtol=1e-6)
        np.testing.assert_allclose(got.length_penalty, cfg.per_token * batch.lengths, rtol=1e-6)
    else:
        centred = np.asarray(got.reward) - np.asarray(got.reward).mean(axis=-1, keepdims=True)
        np.testing.assert_allclose(got.advantages, centred, atol=1e-6)


def test_hop_balance_switch_scales_each_hop_counts_groups_to_equal_mass():
    """advantage_balance=hops: QA prompts are stratified by hop count (rubric and hop-less QA prompts by kind), each
    stratum ends with the same advantage mass; the mass shares are logged with the switch off too, and then the
    advantages are those computed."""
    from searchjax.train.grpo import balance_advantages, prompt_strata

    prompts = [RLPrompt.of({**QA, "id": f"q{n}", "hops": h}, "qa", 5) for n, h in enumerate((2, 2, 3))]
    prompts += [RLPrompt.of(RUBRIC, "rubric", 5), RLPrompt.of({**QA, "id": "plain"}, "qa", 5)]
    assert prompt_strata(prompts) == ["qa_hops2", "qa_hops2", "qa_hops3", "rubric", "qa"]
    adv = np.asarray([[1, -1], [2, -2], [0.5, -0.5], [0, 0], [1, -1]], np.float32)  # masses 2, 4, 1, 0, 2
    off = load_train_config(GRPOConfig, CONFIG)
    same, m = balance_advantages(off, prompts, adv)
    np.testing.assert_array_equal(same, adv)
    assert m == pytest.approx({"advantages/mass_qa": 2 / 9, "advantages/mass_qa_hops2": 6 / 9,
                               "advantages/mass_qa_hops3": 1 / 9, "advantages/mass_rubric": 0.0})
    on = load_train_config(GRPOConfig, CONFIG, ["advantage_balance=hops", "balance_max_scale=2.5"])
    out, m = balance_advantages(on, prompts, adv)
    # M = 9 over the three strata with signal: 3 each; hop 3 alone (mass 1) would need 3, capped at 2.5.
    np.testing.assert_allclose(out, adv * np.asarray([[0.5], [0.5], [2.5], [1.0], [1.5]]), rtol=1e-6)
    assert m["advantages/scale_qa_hops3"] == pytest.approx(2.5) and m["advantages/scale_rubric"] == 1.0


def test_policy_loss_switch_sequence_is_and_clip():
    from searchjax.losses.grpo import grpo_loss, policy_loss, sequence_grpo_loss

    rng = np.random.default_rng(0)
    logp, mu = jnp.asarray(rng.normal(-1, 0.1, (3, 5))), jnp.asarray(rng.normal(-1, 0.1, (3, 5)))
    adv, mask = jnp.asarray([1.0, -0.5, 0.2]), jnp.ones((3, 5), bool)
    seq = load_train_config(GRPOConfig, CONFIG, ["rewards.sequence_is=true"]).rewards
    expected = float(sequence_grpo_loss(logp, mu, adv, mask)[0])
    assert float(policy_loss(logp, mu, adv, mask, seq)[0]) == pytest.approx(expected)
    clip = load_train_config(GRPOConfig, CONFIG, ["rewards.clip_eps=0.2", "minibatches=2"]).rewards
    got = policy_loss(logp, mu, adv, mask, clip, logp_old=logp)[0]
    assert float(got) == pytest.approx(float(grpo_loss(logp, mu, adv, mask)[0]), rel=1e-6)


# ------------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def rl_workspace(workspace, tmp_path_factory):
    """The training workspace plus a reward model with the same tokenizer: a random backbone, a zero head and the
    likelihood term at β = 0.01 (so the responses' assistant masks travel through GRPO's triples and the reference
    cache, and s differs from ½)."""
    from searchjax.model import read_hf_config
    from searchjax.rewards.reward_model import init_reward_params, make_scorer, save_reward_model

    root = tmp_path_factory.mktemp("rl")
    cfg = read_hf_config(workspace["model"])
    params = init_reward_params(cfg, jax.random.key(1), likelihood=True)
    save_reward_model(root / "rm", params.replace(likelihood_weight=jnp.float32(0.01)),
                      make_scorer("pointwise", cfg, likelihood=True))
    (root / "rm" / "tokenizer.json").write_bytes(workspace["tokenizer"].read_bytes())
    return {**workspace, "rm": root / "rm"}


RUN_ARGS = ["steps=3", "save_every=1", "progress=false", "rollout.temperature=0.7", "rollout.max_new_tokens=64"]
DETERMINISTIC = ("loss", "grad_norm", "update_norm", "param_norm", "reward/score/mean", "reward/preference",
                 "penalty/tool", "penalty/length", "response_length", "ref_length", "tool_calls",
                 "canary/logp_abs_diff_max", "rollout_corr/kl", "advantages/std", "weights/version")


def _cmd(ws, out, *extra):
    return [sys.executable, "-m", "searchjax.cli.main", "train", "grpo", "--config", str(CONFIG),
            "--policy", str(ws["model"]), "--reference", str(ws["model"]), "--reward-model", str(ws["rm"]),
            "--prompts", str(ws["qa"]), "--index", str(ws["root"] / "index"), "--out", str(out), *extra]


def _env():
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")


@pytest.fixture(scope="module")
def grpo_run(rl_workspace, tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo") / "run"
    r = subprocess.run(_cmd(rl_workspace, out, *RUN_ARGS), capture_output=True, text=True, env=_env(), timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.mark.slow
def test_grpo_end_to_end_metrics_canary_sync_and_export(grpo_run):
    rows = read_metrics(grpo_run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    names = ("reward/score/mean", "reward/score/std", "reward/base", "reward/base_qa", "reward/preference",
             "penalty/tool", "penalty/length", "penalty/eff", "advantages/mean", "advantages/std",
             "reward/frac_zero_std_groups", "reward/frac_mixed_groups", "response_length", "ref_length", "tool_calls",
             "failed_calls",
             "finish_reason/answer", "rollout_corr/kl", "rollout_corr/is_mean", "rollout_corr/is_max",
             "rollout_corr/frac_truncated", "rollout_corr/ess", "canary/logp_abs_diff_mean",
             "canary/logp_abs_diff_max", "canary/logp_abs_diff_max_same_routes", "rollout_corr/route_mismatch",
             "actor/pg_loss", "actor/entropy", "grad_norm", "lr", "weights/version",
             "timing_s/rollout", "timing_s/reference", "timing_s/reward", "timing_s/train", "timing_s/sync",
             "timing_s/checkpoint", "perf/tokens_per_s")
    for row in rows:
        missing = [n for n in names if n not in row]
        assert not missing, missing
        # The tiny world's questions carry their hop count: r_base of each count present in the batch.
        assert any(k.startswith("reward/base_qa_hops") for k in row), sorted(row)
        assert sum(v for k, v in row.items() if k.startswith("prompts/qa_hops")) == 4  # the batch's 4 prompts
        terms = [row[f"calls_cov/{t}"] for t in ("correct", "preference", "tool", "length")]
        assert row["calls_cov/total"] == pytest.approx(sum(terms), abs=1e-6) and np.all(np.isfinite(terms))
        # The trainer's log π (temperature 0.7 in the chunked path) against the sampler's recorded log μ.
        assert row["canary/logp_abs_diff_max"] <= 1e-4, row["canary/logp_abs_diff_max"]
        assert abs(row["rollout_corr/kl"]) <= 1e-3
        assert row["grad_norm"] > 0 and row["update_norm"] > 0
    assert [r["weights/version"] for r in rows] == [1, 2, 3]
    # The likelihood term reached s: with a zero head alone every s would be exactly ½.
    assert any(abs(r["reward/preference"] - 0.5) > 1e-4 for r in rows), [r["reward/preference"] for r in rows]
    # Steps 2 and 3 reuse the engine: sync after every step, and rollouts of new prompts, compile nothing new
    # beyond the prefill shapes a new prompt length may need.
    assert rows[0]["reference/new_prompts"] == 4 and rows[0]["reference/new_rollouts"] == 16  # G paired each
    assert rows[-1]["reference/cached_prompts"] >= 4
    from searchjax.model import load_hf

    cfg, params = load_hf(grpo_run / "final")
    assert (grpo_run / "final" / "tokenizer.json").exists() and cfg.vocab_size > 0
    summary = json.loads((grpo_run / "summary.json").read_text())
    assert summary["stage"] == "grpo" and summary["steps"] == 3


def _two_steps(ws, out, *extra) -> list[dict]:
    """The metrics of a two-step GRPO run (RUN_ARGS otherwise) with the extra overrides."""
    args = [a for a in RUN_ARGS if not a.startswith(("steps=", "save_every="))]
    r = subprocess.run(_cmd(ws, out, *args, "steps=2", "save_every=0", *extra),
                       capture_output=True, text=True, env=_env(), timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_metrics(out)
    assert [row["step"] for row in rows] == [1, 2]
    return rows


@pytest.mark.slow
def test_grpo_with_routing_replay_runs_and_keeps_the_canary(rl_workspace, tmp_path):
    """rollout.routing_replay=true end to end: the engine's recorded routes reach the trainer's forward."""
    for row in _two_steps(rl_workspace, tmp_path / "replay", "rollout.routing_replay=true"):
        assert row["canary/logp_abs_diff_max"] <= 1e-4 and row["canary/logp_abs_diff_max_same_routes"] <= 1e-4
        assert 0 <= row["rollout_corr/route_mismatch"] <= 1


@pytest.mark.slow
def test_grpo_with_one_shared_reference_per_prompt_and_hop_balance(rl_workspace, tmp_path):
    """rollout.reference=shared end to end: one reference rollout per new prompt instead of G, and the step's
    rewards, loss and canary as with paired references; with advantage_balance=hops each hop count's scale is
    logged beside its mass share (shares of a batch with signal sum to 1); data.stratify=hops draws the prompts."""
    rows = _two_steps(rl_workspace, tmp_path / "shared", "rollout.reference=shared", "advantage_balance=hops",
                      "data.stratify=hops")
    assert rows[0]["reference/new_rollouts"] == rows[0]["reference/new_prompts"] == 4
    for row in rows:
        assert row["canary/logp_abs_diff_max"] <= 1e-4 and row["grad_norm"] > 0
        shares = {k[len("advantages/mass_"):]: v for k, v in row.items() if k.startswith("advantages/mass_")}
        assert shares and all(k.startswith("qa_hops") for k in shares), sorted(row)
        assert sum(shares.values()) == pytest.approx(1.0, abs=1e-5) or sum(shares.values()) == 0.0
        assert all(0 < row[f"advantages/scale_{k}"] <= 4.0 for k in shares)
        assert all(np.isfinite(row[k]) for k in ("reward/score/mean", "penalty/length", "ref_length"))


@pytest.mark.slow
def test_grpo_with_dynamic_sampling_and_no_preference_term(rl_workspace, tmp_path):
    """filter_groups=true end to end, under the linear ablation with weight 0: the reward model is not run (no
    reward/preference), each step draws 1–2 batches, and the batch's mixed share matches what was filled."""
    rows = _two_steps(rl_workspace, tmp_path / "filter", "filter_groups=true", "filter_max_draws=2",
                      "rewards.aggregation=linear", "rewards.linear_weight=0.0")
    for row in rows:
        assert "reward/preference" not in row and row["canary/logp_abs_diff_max"] <= 1e-4
        assert row["filter/draws"] in (1.0, 2.0) and 0 <= row["filter/frac_mixed_drawn"] <= 1
        assert row["reward/frac_mixed_groups"] == pytest.approx((4 - row["filter/filled"]) / 4)
        assert row["filter/filled"] == 0 or row["filter/draws"] == 2  # filled only once the draws ran out
        assert np.isfinite(row["reward/score/mean"]) and row["perf/tokens_per_s"] > 0


@pytest.mark.slow
def test_grpo_snr_tool_builds_the_run_and_reports_every_variant(rl_workspace, tmp_path):
    """tools/grpo_snr.py end to end on the tiny preset: 3 batches as the loop draws them, the gradient of each
    advantage variant at the start weights, the Gram statistics; --rollouts-only skips the gradients."""
    tool = Path(__file__).resolve().parents[2] / "tools" / "grpo_snr.py"
    ws = rl_workspace
    base = [sys.executable, str(tool), "--config", str(CONFIG), "--policy", str(ws["model"]),
            "--reference", str(ws["model"]), "--reward-model", str(ws["rm"]), "--prompts", str(ws["qa"]),
            "--index", str(ws["root"] / "index"), "--batches", "3"]
    extra = ["rollout.temperature=0.7", "rollout.max_new_tokens=64"]
    r = subprocess.run([*base, "--out", str(tmp_path / "snr.json"), *extra], capture_output=True, text=True,
                       env=_env(), timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads((tmp_path / "snr.json").read_text())
    cfg = load_train_config(GRPOConfig, CONFIG, [])
    assert rep["rollouts_per_batch"] == cfg.batch_size * cfg.rollout.group_size
    assert [b["groups"] for b in rep["per_batch"]] == [cfg.batch_size] * 3
    assert all(0 <= b["mixed_groups"] <= b["groups"] for b in rep["per_batch"])
    assert rep["parameters"] > 0 and set(rep["variants"]) == {"R", "R_nostd", "r_base", "pen"}
    for v in rep["variants"].values():
        assert v["signal2"] + v["noise2"] >= 0 and v["signal2_se"] >= 0
    assert set(rep["signal_corr"]) == {"R~R_nostd", "R~r_base", "R~pen", "R_nostd~r_base", "R_nostd~pen",
                                       "r_base~pen"}
    r = subprocess.run([*base, "--rollouts-only", *extra], capture_output=True, text=True, env=_env(), timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    only = json.loads(r.stdout[r.stdout.index("{\n"):])
    assert "variants" not in only and only["groups"] == 3 * cfg.batch_size
    assert only["per_batch"] == [{**b, "s": o["s"]} for b, o in zip(rep["per_batch"], only["per_batch"])]
    cov = only["calls_cov"]  # which term of R pushes the calls: every group, then by hop count
    assert cov["all"]["groups"] == 3 * cfg.batch_size == sum(v["groups"] for k, v in cov.items() if k != "all")
    terms = ("correct", "preference", "tool", "length")
    assert cov["all"]["total"] == pytest.approx(sum(cov["all"][t] for t in terms), abs=1e-6)
    assert cov == rep["calls_cov"]  # the same batches with or without the gradients
    rm = only["rm_logit"]  # the reward model's logit in its parts: the tiny RM's head is zero, so all likelihood
    assert rm == rep["rm_logit"] and rm["calls_cov"]["all"]["groups"] == 3 * cfg.batch_size
    for label, c in rm["calls_cov"].items():
        assert c["logit"] == pytest.approx(c["head"] + c["likelihood"], abs=1e-5)
        assert c["head"] == pytest.approx(0.0, abs=1e-5) and c["likelihood"] == pytest.approx(c["logit"], abs=1e-6)
        slope = rm["per_call"][label]
        assert slope["logit"] is None or slope["logit"] == pytest.approx(slope["likelihood"], abs=1e-5)


@pytest.mark.slow
def test_grpo_probe_tool_scores_fixed_training_prompts_at_saved_steps(rl_workspace, grpo_run, tmp_path):
    """tools/grpo_probe.py on the tiny run: the same n training prompts with the start policy (step 0) and the
    weights of each saved step swapped in, r_base per prompt and step, the trend; a step that was not saved is
    refused before any rollout, naming the saved ones."""
    tool = Path(__file__).resolve().parents[2] / "tools" / "grpo_probe.py"
    base = [sys.executable, str(tool), "--run", str(grpo_run), "--index", str(rl_workspace["root"] / "index"),
            "--n", "4"]
    r = subprocess.run([*base, "--steps", "0", "9"], capture_output=True, text=True, env=_env(), timeout=600)
    assert r.returncode != 0 and "no checkpoint at step 9" in r.stderr and "saved steps" in r.stderr, r.stderr[-2000:]
    out, records = tmp_path / "probe.json", tmp_path / "probe.jsonl"
    r = subprocess.run([*base, "--steps", "3", "0", "2", "--out", str(out), "--records", str(records), "--png",
                        str(tmp_path / "probe.png")],
                       capture_output=True, text=True, env=_env(), timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert rep["steps"] == [0, 2, 3] and rep["n"] == 4 and rep["temperature"] == 0.0 and rep["samples"] == 1
    assert rep["weights_version"] == {"0": 0, "2": 2, "3": 3} and (tmp_path / "probe.png").exists()
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    train = {q["id"] for q in map(json.loads, rl_workspace["qa"].read_text().splitlines()) if q["split"] == "train"}
    by_step = {s: [row for row in rows if row["step"] == s] for s in (0, 2, 3)}
    assert len(rows) == 12 and len({frozenset(row["id"] for row in v) for v in by_step.values()}) == 1
    assert {row["id"] for row in rows} <= train
    for s, v in by_step.items():
        assert rep["accuracy"][str(s)] == pytest.approx(np.mean([row["r_base"] for row in v]))
        assert sum(c for c, _ in rep["accuracy_by_hops"][str(s)].values()) == sum(row["r_base"] for row in v)
    t = rep["trend"]
    assert t["lo"] <= t["slope"] <= t["hi"] and rep["first_vs_last"]["gained"] + rep["first_vs_last"]["lost"] <= 4
    # K samples at T > 0: a prompt's outcome is the mean r_base of its K rollouts.
    r = subprocess.run([*base[:-1], "2", "--steps", "0", "3", "--temperature", "0.7", "--samples", "3", "--out",
                        str(out), "--records", str(records)], capture_output=True, text=True, env=_env(), timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    rep, rows = json.loads(out.read_text()), [json.loads(line) for line in records.read_text().splitlines()]
    assert rep["samples"] == 3 and len(rows) == 2 * 2 * 3
    assert sorted(row["sample"] for row in rows if row["step"] == 3) == [0, 0, 1, 1, 2, 2]
    for s in (0, 3):
        assert rep["accuracy"][str(s)] == pytest.approx(np.mean([row["r_base"] for row in rows if row["step"] == s]))


def _committed(run: Path, step: int) -> bool:
    return (run / "checkpoints" / str(step) / "meta").exists()


@pytest.mark.slow
def test_grpo_kill_9_then_resume_matches_uninterrupted(rl_workspace, grpo_run, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(_cmd(rl_workspace, out, *RUN_ARGS), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=_env())
    t0 = time.monotonic()
    while not _committed(out, 2):
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.monotonic() - t0 < 1200, "step 2 was never saved"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "final").exists()
    r = subprocess.run(_cmd(rl_workspace, out, *RUN_ARGS), capture_output=True, text=True, env=_env(), timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming" in r.stdout and "cached reference prompts" in r.stdout
    ref = {row["step"]: row for row in read_metrics(grpo_run)}
    got = {row["step"]: row for row in read_metrics(out)}
    assert sorted(got) == sorted(ref)
    for step, row in ref.items():
        for key in DETERMINISTIC:
            assert got[step][key] == row[key], (step, key, got[step][key], row[key])


def test_grpo_cli_bad_input_fails_before_loading(rl_workspace, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(QA) + "\n" + '{"id": "x", "question": 5, "answer": "a"}\n')
    r = subprocess.run(_cmd({**rl_workspace, "qa": bad}, tmp_path / "run"), capture_output=True, text=True,
                       env=_env(), timeout=600)
    assert r.returncode != 0 and "bad.jsonl:2" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    r = subprocess.run(_cmd({**rl_workspace, "rm": tmp_path}, tmp_path / "run2"), capture_output=True, text=True,
                       env=_env(), timeout=600)
    assert r.returncode != 0 and "--reward-model" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(_cmd(rl_workspace, tmp_path / "run3", "rollout.top_p=0.9"), capture_output=True, text=True,
                       env=_env(), timeout=600)
    assert r.returncode != 0 and "top_p" in r.stderr and "Traceback" not in r.stderr

