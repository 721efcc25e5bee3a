"""The reward model's likelihood term (searchjax.rewards.reward_model, `likelihood=True`): the score's definition
against the plain forward, padding invariance, the zero start, exact order averaging, the checkpoint round trip,
the assistant masks it reads (preference encoding, PreferenceScorer, GRPO's triples and reference cache), the
configurations it refuses, and one training step that moves β."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.data.preferences import encode_prompt_response
from searchjax.model import forward
from searchjax.rewards.reward_model import (
    PointwiseScorer,
    Segment,
    from_policy,
    load_reward_model,
    make_scorer,
    save_reward_model,
    values,
)
from searchjax.rollout.preference import PreferenceScorer
from searchjax.testing.models import tiny_model
from tests.rewards.test_reward_model import PAD, char_encode


@pytest.fixture(scope="module")
def model():
    """A tiny backbone (its own LM head) with a random value head and β = 0.7."""
    cfg, policy = tiny_model("tiny", seed=0)
    params = from_policy(policy, cfg, likelihood=True)
    assert params.backbone.lm_head is not None and float(params.likelihood_weight) == 0.0
    return cfg, params.replace(head=jax.random.normal(jax.random.key(1), params.head.shape),
                               likelihood_weight=jnp.float32(0.7))


def rows_and_masks(seed: int, n: int, width: int):
    rng = np.random.default_rng(seed)
    tokens = np.full((n, width), PAD, np.int32)
    mask = np.zeros((n, width), np.int32)
    lengths = rng.integers(6, width - 3, n).astype(np.int32)
    for i, n_i in enumerate(lengths):
        tokens[i, :n_i] = rng.integers(1, 256, n_i)
        start = int(rng.integers(1, n_i - 2))  # the response starts here; a random half of it is "assistant"
        mask[i, start:n_i] = rng.integers(0, 2, n_i - start)
    return jnp.asarray(tokens), jnp.asarray(lengths), jnp.asarray(mask)


_values = jax.jit(values, static_argnames=("cfg",))


def test_score_is_the_head_plus_beta_times_the_masked_log_likelihood(model):
    cfg, params = model
    tokens, lengths, mask = rows_and_masks(0, 3, 24)
    got = _values(params, tokens, lengths, cfg, mask=mask)
    head_only = _values(params.replace(likelihood_weight=None), tokens, lengths, cfg)
    logp = jax.nn.log_softmax(forward(params.backbone, tokens, cfg).astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]  # predicts t + 1
    want = head_only + 0.7 * jnp.sum(picked * mask[:, 1:], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert float(jnp.abs(got - head_only).min()) > 1e-3, "the likelihood term should change every score"


def test_padding_and_junk_after_the_row_never_change_a_score(model):
    cfg, params = model
    tokens, lengths, mask = rows_and_masks(1, 3, 24)
    alone = _values(params, tokens, lengths, cfg, mask=mask)
    wide = jnp.pad(tokens, ((0, 0), (0, 17)), constant_values=77)  # junk, not PAD, after every row
    junk_mask = jnp.pad(mask, ((0, 0), (0, 17)), constant_values=1)  # and a mask that claims it: ignored
    np.testing.assert_allclose(_values(params, wide, lengths, cfg, mask=junk_mask), alone, rtol=1e-5, atol=1e-5)


def test_the_likelihood_model_starts_indifferent_and_averages_exactly(model):
    cfg, params = model
    scorer = PointwiseScorer(cfg, likelihood=True)
    x = Segment(*rows_and_masks(2, 4, 12)[:2])
    a_ids, a_len, a_mask = rows_and_masks(3, 4, 12)
    b_ids, b_len, b_mask = rows_and_masks(4, 4, 12)
    a, b = Segment(a_ids, a_len, a_mask), Segment(b_ids, b_len, b_mask)
    pref = jax.jit(scorer.preference)
    p_ab, p_ba = np.asarray(pref(params, x, a, b)), np.asarray(pref(params, x, b, a))
    np.testing.assert_array_equal(p_ab + p_ba, np.ones(4, np.float32))
    assert np.all(np.abs(p_ab - 0.5) > 1e-4)
    fresh = from_policy(tiny_model("tiny", seed=0)[1], cfg, likelihood=True)  # zero head, β = 0
    np.testing.assert_array_equal(pref(fresh, x, a, b), np.full(4, 0.5, np.float32))
    with pytest.raises(ValueError, match="assistant masks"):
        scorer.deltas(params, x, Segment(a_ids, a_len), b)


def test_checkpoint_round_trip_keeps_the_lm_head_and_beta(model, tmp_path):
    cfg, params = model
    scorer = PointwiseScorer(cfg, likelihood=True)
    save_reward_model(tmp_path / "rm", params, scorer, max_shard_bytes=300_000)
    loaded, loaded_scorer = load_reward_model(tmp_path / "rm")
    assert loaded_scorer == scorer and loaded_scorer.likelihood
    chex.assert_trees_all_equal(loaded, params)
    with pytest.raises(ValueError, match="does not match the params"):
        save_reward_model(tmp_path / "bad", params, PointwiseScorer(cfg))


def test_only_the_pointwise_scorer_takes_the_likelihood_term(model):
    from searchjax.config import ConfigError, configs_dir
    from searchjax.train.config import load_train_config
    from searchjax.train.reward_model import RMConfig

    cfg, _ = model
    with pytest.raises(ValueError, match="needs the pointwise scorer"):
        make_scorer("pairwise", cfg, None, likelihood=True)
    path = configs_dir() / "train" / "rm_tiny.yaml"
    assert load_train_config(RMConfig, path, ["likelihood=true"]).likelihood
    with pytest.raises(ConfigError, match="likelihood: true needs scorer: pointwise"):
        load_train_config(RMConfig, path, ["likelihood=true", "scorer=pairwise"])


CONVERSATION = {
    "prompt": [{"role": "user", "content": "Where was Ada born?"}],
    "response": [
        {"role": "assistant", "content": "", "reasoning_content": "I will search.",
         "tool_calls": [{"type": "function", "function": {"name": "search_web", "arguments": {"query": "Ada"}}}]},
        {"role": "tool", "content": "Ada was born in Paris."},
        {"role": "assistant", "content": "The answer is Paris.", "reasoning_content": "Found it."},
    ],
}


def test_response_masks_mark_exactly_the_assistant_turns():
    x, (a,), (mask,) = encode_prompt_response(char_encode, CONVERSATION["prompt"], [CONVERSATION["response"]],
                                              masks=True)
    assert len(mask) == len(a) and set(np.unique(mask)) == {0, 1}
    text = "".join(chr(i - 1) for i in a)
    marked = "".join(c for c, m in zip(text, mask) if m)
    assert "Ada was born in Paris." not in marked and "Ada was born in Paris." in text  # the tool response: 0
    assert "The answer is Paris.<|im_end|>" in marked and "I will search." in marked
    assert "<|im_start|>assistant\n" not in marked  # the turn header is the template's, not the assistant's
    assert encode_prompt_response(char_encode, CONVERSATION["prompt"], [CONVERSATION["response"]]) == (x, [a])


def test_preference_scorer_reads_masks_and_matches_the_pure_scorer(model):
    cfg, params = model
    scorer = PreferenceScorer(params, PointwiseScorer(cfg, likelihood=True), char_encode, batch_pairs=2,
                              buckets=(128, 256))
    assert scorer.needs_masks
    prompts = ["Is the sky blue?", "Name a city."]
    rollouts, references = ["Yes, it is.", "Paris."], ["No.", "Berlin, I think."]
    triples = scorer.encode_triples(prompts, rollouts, references)
    assert all(len(t) == 5 for t in triples)
    p, d_ab, d_ba = scorer.deltas_ids(triples)
    np.testing.assert_array_equal(d_ba, -d_ab)
    for i, (x, a, b, ma, mb) in enumerate(triples):
        seg = lambda ids, m=None: Segment(jnp.asarray([ids], jnp.int32), jnp.asarray([len(ids)], jnp.int32),  # noqa: E731
                                          None if m is None else jnp.asarray([m], jnp.int32))
        want = PointwiseScorer(cfg, likelihood=True).delta(params, seg(x), seg(a, ma), seg(b, mb))
        np.testing.assert_allclose(d_ab[i], want[0], rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="needs \\(x, a, b, mask_a, mask_b\\)"):
        scorer.score_ids([t[:3] for t in triples])


def test_grpo_triples_carry_the_records_loss_masks_and_the_cache_keeps_them():
    from searchjax.rollout.records import RolloutRecord
    from searchjax.train.rl import ReferenceCache, ReferenceRollout

    rec = RolloutRecord(prompt_id="p", group_index=0, tokens=[5, 6, 7, 8, 9], loss_mask=[0, 0, 1, 0, 1],
                        logprobs=[0.0, 0.0, -1.0, 0.0, -2.0], prompt_length=2, tool_calls=0, tool_failures=0,
                        response_length=2, answer="x", finish_reason="stop")
    rec.check()
    ref = ReferenceRollout.of(rec)
    assert ref.mask == (1, 0, 1) and ref.response == (7, 8, 9)
    cache = ReferenceCache(1, {"p": [ref]})
    assert ReferenceCache.from_json(cache.to_json())["p"] == (ref,)
    old = cache.to_json()
    old["entries"]["p"] = [e[:3] for e in old["entries"]["p"]]  # a cache saved before masks were kept
    assert ReferenceCache.from_json(old)["p"][0].mask is None


def test_training_pairs_carry_each_rows_assistant_mask(model):
    from searchjax.train.reward_model import encode_pairs, pad_pairs

    cfg, _ = model
    wrong = [*CONVERSATION["response"][:2], {"role": "assistant", "content": "The answer is Rome."}]
    record = {"id": "r", "category": "correctness", "prompt": CONVERSATION["prompt"],
              "chosen": CONVERSATION["response"], "rejected": wrong}
    (pair,), dropped = encode_pairs([record], PointwiseScorer(cfg, likelihood=True), char_encode, 4096)
    x, (a, b), (ma, mb) = encode_prompt_response(char_encode, record["prompt"], [record["chosen"], wrong],
                                                 masks=True)
    assert dropped == 0 and [list(m) for m in pair["masks"]] == [[0] * len(x) + list(ma), [0] * len(x) + list(mb)]
    batch = pad_pairs([pair], 512, PAD)
    assert batch["mask"].shape == batch["tokens"].shape == (1, 2, 512)
    assert batch["mask"].sum() == ma.sum() + mb.sum()
    (plain,), _ = encode_pairs([record], PointwiseScorer(cfg), char_encode, 4096)
    assert "masks" not in plain and "mask" not in pad_pairs([plain], 512, PAD)
