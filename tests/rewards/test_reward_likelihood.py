"""The reward model's likelihood term (searchjax.rewards.reward_model, `likelihood=True`): the score's definition
against the plain forward, padding invariance, the zero start, exact order averaging, the checkpoint round trip,
the assistant masks it reads (preference encoding, PreferenceScorer, GRPO's triples and reference cache), the
pairwise scorer's slot-A term, and the configurations that take it."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchjax.data.preferences import encode_prompt_response
from searchjax.model import forward
from searchjax.rewards.reward_model import (
    PairTemplate,
    PairwiseScorer,
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


PAIR = PairTemplate(a=(201, 202, 203), b=(204, 205), end=(206, 207, 208, 209))


def test_pairwise_likelihood_reads_slot_a_and_is_antisymmetric(model):
    """Δ(x, a, b) = u(x‖A‖a‖B‖b‖E) + β[ℓ_A(row₁) − ℓ_A(row₂)] with ℓ_A the masked log-likelihood of the response in
    slot A only (the plain forward, by hand); the likelihood part cancels in Δ(x, a, b) + Δ(x, b, a)."""
    cfg, params = model
    scorer = make_scorer("pairwise", cfg, PAIR, likelihood=True)
    assert isinstance(scorer, PairwiseScorer) and scorer.likelihood
    x = Segment(*rows_and_masks(5, 3, 10)[:2])
    a, b = Segment(*rows_and_masks(6, 3, 12)), Segment(*rows_and_masks(7, 3, 12))
    d_ab, d_ba = jax.jit(scorer.deltas)(params, x, a, b)

    def by_hand(first, second):  # the row x‖A‖first‖B‖second‖E, with first's mask only
        ids, mask = [], []
        for i in range(3):
            pieces = [(x.ids[i, :x.lengths[i]], 0), (jnp.asarray(PAIR.a), 0), (first.ids[i, :first.lengths[i]],
                      first.mask[i, :first.lengths[i]]), (jnp.asarray(PAIR.b), 0),
                      (second.ids[i, :second.lengths[i]], 0), (jnp.asarray(PAIR.end), 0)]
            ids.append(np.concatenate([np.asarray(p) for p, _ in pieces]))
            mask.append(np.concatenate([np.broadcast_to(np.asarray(m), np.asarray(p).shape) for p, m in pieces]))
        width = max(map(len, ids))
        tokens = np.stack([np.pad(r, (0, width - len(r)), constant_values=PAD) for r in ids])
        masks = np.stack([np.pad(m, (0, width - len(m))) for m in mask])
        lengths = jnp.asarray([len(r) for r in ids], jnp.int32)
        head = _values(params.replace(likelihood_weight=None), jnp.asarray(tokens), lengths, cfg)
        lik = _values(params, jnp.asarray(tokens), lengths, cfg, mask=jnp.asarray(masks)) - head
        return head, lik

    (u1, l1), (u2, l2) = by_hand(a, b), by_hand(b, a)
    np.testing.assert_allclose(d_ab, u1 + l1 - l2, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(d_ba, u2 + l2 - l1, rtol=1e-5, atol=1e-4)
    assert float(jnp.abs(l1 - l2).min()) > 1e-3, "the slot-A likelihoods should differ"
    np.testing.assert_allclose(d_ab + d_ba, u1 + u2, rtol=1e-5, atol=1e-4)  # position bias: the head's alone
    pref = jax.jit(scorer.preference)
    np.testing.assert_array_equal(pref(params, x, a, b) + pref(params, x, b, a), np.ones(3, np.float32))


def test_both_scorers_take_the_likelihood_term_and_round_trip(model, tmp_path):
    from searchjax.config import configs_dir
    from searchjax.train.config import load_train_config
    from searchjax.train.reward_model import RMConfig

    cfg, params = model
    path = configs_dir() / "train" / "rm_tiny.yaml"
    for kind in ("pointwise", "pairwise"):
        got = load_train_config(RMConfig, path, ["likelihood=true", f"scorer={kind}"])
        assert got.likelihood and got.scorer == kind
    scorer = make_scorer("pairwise", cfg, PAIR, likelihood=True)
    save_reward_model(tmp_path / "rm", params, scorer, max_shard_bytes=300_000)
    loaded, loaded_scorer = load_reward_model(tmp_path / "rm")
    assert loaded_scorer == scorer
    chex.assert_trees_all_equal(loaded, params)


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


@pytest.mark.parametrize("kind", ["pointwise", "pairwise"])
def test_preference_scorer_reads_masks_and_matches_the_pure_scorer(model, kind):
    cfg, params = model
    pure = make_scorer(kind, cfg, PAIR if kind == "pairwise" else None, likelihood=True)
    scorer = PreferenceScorer(params, pure, char_encode, batch_pairs=2, buckets=(128, 256))
    assert scorer.needs_masks
    prompts = ["Is the sky blue?", "Name a city."]
    rollouts, references = ["Yes, it is.", "Paris."], ["No.", "Berlin, I think."]
    triples = scorer.encode_triples(prompts, rollouts, references)
    assert all(len(t) == 5 for t in triples)
    p, d_ab, d_ba = scorer.deltas_ids(triples)
    if kind == "pointwise":
        np.testing.assert_array_equal(d_ba, -d_ab)
    for i, (x, a, b, ma, mb) in enumerate(triples):
        seg = lambda ids, m=None: Segment(jnp.asarray([ids], jnp.int32), jnp.asarray([len(ids)], jnp.int32),  # noqa: E731
                                          None if m is None else jnp.asarray([m], jnp.int32))
        want = pure.deltas(params, seg(x), seg(a, ma), seg(b, mb))
        np.testing.assert_allclose([d_ab[i], d_ba[i]], [want[0][0], want[1][0]], rtol=1e-5, atol=1e-4)
    swapped = scorer.score_ids([(x, b, a, mb, ma) for x, a, b, ma, mb in triples])
    np.testing.assert_array_equal(p + swapped, np.ones(len(triples), np.float32))
    with pytest.raises(ValueError, match="needs \\(x, a, b, mask_a, mask_b\\)"):
        scorer.score_ids([t[:3] for t in triples])


@pytest.mark.parametrize("kind", ["pointwise", "pairwise"])
def test_logit_parts_split_the_preference_logit_into_head_and_likelihood(model, kind):
    """logit_parts: σ(logit) is P̄; the parts add up to it; with β = 0 it is all head, with a zero head all
    likelihood; pointwise, the likelihood part is β · (ℓ_a − ℓ_b) of each response's own row."""
    cfg, params = model
    pure = make_scorer(kind, cfg, PAIR if kind == "pairwise" else None, likelihood=True)
    prompts = ["Is the sky blue?", "Name a city.", "Count to three."]
    rollouts, references = ["Yes, it is.", "Paris.", "one two three"], ["No.", "Berlin, I think.", "1 2 3"]

    def parts(prm):
        scorer = PreferenceScorer(prm, pure, char_encode, batch_pairs=2, buckets=(128, 256))
        triples = scorer.encode_triples(prompts, rollouts, references)
        return scorer.score_ids(triples), scorer.logit_parts(triples), triples

    p, got, triples = parts(params)
    np.testing.assert_allclose(jax.nn.sigmoid(got["logit"]), p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["head"] + got["likelihood"], got["logit"], rtol=1e-5, atol=1e-5)
    assert np.all(np.abs(got["likelihood"]) > 1e-3) and np.all(np.abs(got["head"]) > 1e-3)
    _, no_beta, _ = parts(params.replace(likelihood_weight=jnp.float32(0.0)))
    np.testing.assert_array_equal(no_beta["likelihood"], 0.0)
    np.testing.assert_allclose(no_beta["head"], no_beta["logit"], rtol=1e-6)
    np.testing.assert_allclose(no_beta["head"], got["head"], rtol=1e-4, atol=1e-4)  # β moves only its own part
    _, no_head, _ = parts(params.replace(head=jnp.zeros_like(params.head)))
    np.testing.assert_allclose(no_head["head"], 0.0, atol=1e-5)
    np.testing.assert_allclose(no_head["likelihood"], got["likelihood"], rtol=1e-4, atol=1e-4)
    if kind == "pointwise":
        for i, (x, a, b, ma, mb) in enumerate(triples):
            lik = [values(params, jnp.asarray([x + r], jnp.int32), jnp.asarray([len(x) + len(r)], jnp.int32), cfg,
                          mask=jnp.asarray([[0] * len(x) + m], jnp.int32), parts=True)[1][0]
                   for r, m in ((a, ma), (b, mb))]
            assert got["likelihood"][i] == pytest.approx(float(lik[0] - lik[1]), rel=1e-4, abs=1e-4)


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
    (pair,), _ = encode_pairs([record], make_scorer("pairwise", cfg, PAIR, likelihood=True), char_encode, 4096)
    for row, m, first, first_mask in zip(pair["rows"], pair["masks"], (a, b), (ma, mb)):
        start = len(x) + len(PAIR.a)  # slot A: the only response whose tokens the term reads
        assert len(m) == len(row) and list(row[start:start + len(first)]) == list(first)
        assert list(m[start:start + len(first)]) == list(first_mask) and m.sum() == first_mask.sum()


def test_grpo_masks_equal_the_masks_the_reward_model_was_trained_with():
    """A rollout laid out token for token as the chat template renders the conversation: its triple's mask (the
    loss mask plus each turn's opening "<think>\\n", which the driver appends) is the preference encoding's."""
    from searchjax.chat.template import render, render_segments
    from searchjax.rollout.agent import TOOLS, PromptItem
    from searchjax.rollout.records import RolloutRecord
    from searchjax.train.rl import PreferenceInputs, ReferenceCache, ReferenceRollout, RLPrompt

    prompt, response = CONVERSATION["prompt"], CONVERSATION["response"]
    head = render(prompt, list(TOOLS), add_generation_prompt=True)
    segments = render_segments([*prompt, *response], list(TOOLS), add_generation_prompt=False)
    text = "".join(seg.text for seg in segments)
    assert text.startswith(head)
    loss_mask = [int(seg.trainable) for seg in segments for _ in seg.text]
    opening = "<|im_start|>assistant\n<think>\n"  # appended by the driver: the model generates what follows
    for at in [i for i in range(len(text)) if text.startswith(opening, i)]:
        loss_mask[at:at + len(opening)] = [0] * len(opening)
    tokens, n = char_encode(text), len(head)
    rec = RolloutRecord(prompt_id="p", group_index=0, tokens=tokens, loss_mask=loss_mask,
                        logprobs=[0.0] * len(tokens), prompt_length=n, tool_calls=1, tool_failures=0,
                        response_length=sum(loss_mask), answer="Paris", finish_reason="stop")
    rec.check()
    item = RLPrompt(PromptItem("p", tuple(prompt)), "qa", {})
    cache = ReferenceCache(1, {"p": [ReferenceRollout.of(rec)]})
    (x, a, b, ma, mb), = PreferenceInputs(char_encode, likelihood_turns="all").triples([item], [[rec]], cache,
                                                                                        masks=True)
    want_x, (want_a,), (want_mask,) = encode_prompt_response(char_encode, prompt, [response], masks=True)
    assert (x, a, b) == (want_x, want_a, want_a) and ma == mb == list(want_mask)
    assert sum(ma) == sum(loss_mask) + 2 * len("<think>\n") > 0  # the openings of both turns were added
    # "last" (the default): only the final turn, as a preference pair whose prompt holds the search and whose
    # response is the answer turn marks it
    (x2, a2, b2, la, lb), = PreferenceInputs(char_encode).triples([item], [[rec]], cache, masks=True)
    _, (final,), (final_mask,) = encode_prompt_response(char_encode, [*prompt, *response[:-1]], [response[-1:]],
                                                        masks=True)
    assert (x2, a2, b2) == (x, a, b) and la == lb and len(la) == len(a)
    assert la == [0] * (len(a) - len(final)) + list(final_mask) and list(a[-len(final):]) == list(final)
    assert 0 < sum(la) < sum(ma) and "".join(chr(i - 1) for i, m in zip(a, la) if m).startswith("<think>")
    with pytest.raises(ValueError, match="likelihood_turns: expected 'last' or 'all', got 'first'"):
        PreferenceInputs(char_encode, likelihood_turns="first")
