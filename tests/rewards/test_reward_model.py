"""The reward model (searchjax.rewards.reward_model): value head, padding invariance, both scorers, the pairwise
template, exact order averaging, the symmetric loss and its gradient, and the HF checkpoint round trip."""

import json

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.model import load_hf
from searchjax.rewards.bradley_terry import bt_loss, bt_nll
from searchjax.rewards.reward_model import (
    PAIR_TEMPLATE,
    PairTemplate,
    PairwiseScorer,
    PointwiseScorer,
    RewardParams,
    Segment,
    abstract_reward_params,
    averaged_preference,
    concat,
    from_policy,
    init_reward_params,
    load_reward_model,
    reward_param_shardings,
    save_reward_model,
    values,
)
from searchjax.sharding import make_mesh
from searchjax.testing.models import tiny_config, tiny_model

PAD = 0


def char_encode(text: str) -> list[int]:
    """A character-level 'tokenizer' for template tests: ids 1..255, so PAD = 0 never occurs inside text."""
    return [1 + ord(c) % 255 for c in text]


def char_decode(ids) -> str:
    return "".join(chr(i - 1) for i in ids)


@pytest.fixture(scope="module")
def model():
    """A tiny backbone with a random (non-zero) head, so scores differ between sequences."""
    cfg, policy = tiny_model("tiny", seed=0)
    params = from_policy(policy, cfg)
    head = jax.random.normal(jax.random.key(1), params.head.shape)
    return cfg, params.replace(head=head)


def segment(rows: list[list[int]], width: int | None = None) -> Segment:
    width = width or max(len(r) for r in rows)
    ids = np.full((len(rows), width), PAD, np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    return Segment(jnp.asarray(ids), jnp.asarray([len(r) for r in rows], jnp.int32))


def random_rows(seed: int, n: int, lo: int, hi: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(rng.integers(1, 256, rng.integers(lo, hi + 1))) for _ in range(n)]


_values = jax.jit(values, static_argnames=("cfg",))
_JITTED: dict = {}


def compiled(scorer, method: str):
    """One jitted `scorer.<method>` per scorer, shared by every test (each compile of the model costs seconds)."""
    key = (scorer, method)
    if key not in _JITTED:
        _JITTED[key] = jax.jit(getattr(scorer, method))
    return _JITTED[key]


def scorers(cfg):
    return [PointwiseScorer(cfg), PairwiseScorer(cfg, PairTemplate.from_encoder(char_encode))]


@pytest.fixture(scope="module")
def pairs():
    return tuple(segment(random_rows(s, 4, 2, 12), 12) for s in (10, 11, 12))




def test_padding_and_batch_companions_never_change_a_score(model):
    cfg, params = model
    rows = random_rows(0, 3, 5, 40)
    alone = [float(_values(params, *jax.tree.leaves(segment([r], 40)), cfg)[0]) for r in rows]
    for width in (40, 97):
        s = segment(rows, width)
        np.testing.assert_allclose(_values(params, s.ids, s.lengths, cfg), alone, rtol=1e-5, atol=1e-6)
    # Garbage (not PAD) after the valid prefix is just as invisible.
    s = segment(rows, 97)
    junk = jnp.where(jnp.arange(97)[None] < s.lengths[:, None], s.ids, 77)
    np.testing.assert_allclose(_values(params, junk, s.lengths, cfg), alone, rtol=1e-5, atol=1e-6)


def test_zero_head_scores_every_pair_one_half(pairs):
    cfg = tiny_config("tiny")
    params = init_reward_params(cfg, jax.random.key(0))
    np.testing.assert_array_equal(compiled(PointwiseScorer(cfg), "preference")(params, *pairs), np.full(4, 0.5))


def test_concat_keeps_only_valid_tokens_in_order():
    x, a = segment([[1, 2, 3], [4]], 5), segment([[7], [8, 9]], 4)
    out = concat([x, a], pad_id=PAD)
    np.testing.assert_array_equal(out.lengths, [4, 3])
    np.testing.assert_array_equal(out.ids, [[1, 2, 3, 7, 0, 0, 0, 0, 0], [4, 8, 9, 0, 0, 0, 0, 0, 0]])


def test_pairwise_template_renders_both_orders_as_documented(model):
    cfg, _ = model
    scorer = PairwiseScorer(cfg, PairTemplate.from_encoder(char_encode))
    texts = {"x": "<|im_start|>user\nQ?<|im_end|>\n", "a": "<|im_start|>assistant\nYes.<|im_end|>\n",
             "b": "<|im_start|>assistant\nNo, never.<|im_end|>\n"}
    x, a, b = (segment([char_encode(texts[k])], 60) for k in "xab")
    first, second = (concat(r, PAD) for r in scorer.rows(x, a, b, scorer.marks(1)))
    t = {k: PAIR_TEMPLATE[k] for k in ("a", "b", "end")}
    want_ab = texts["x"] + t["a"] + texts["a"] + t["b"] + texts["b"] + t["end"]
    want_ba = texts["x"] + t["a"] + texts["b"] + t["b"] + texts["a"] + t["end"]
    assert char_decode(first.ids[0, : int(first.lengths[0])]) == want_ab
    assert char_decode(second.ids[0, : int(second.lengths[0])]) == want_ba


def test_pointwise_delta_is_a_difference_of_scores(model, pairs):
    cfg, params = model
    x, a, b = pairs
    s_a = _values(params, *jax.tree.leaves(concat([x, a], PAD)), cfg)
    s_b = _values(params, *jax.tree.leaves(concat([x, b], PAD)), cfg)
    d_ab, d_ba = compiled(PointwiseScorer(cfg), "deltas")(params, x, a, b)
    np.testing.assert_allclose(d_ab, s_a - s_b, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(d_ba, -d_ab)


@pytest.mark.parametrize("kind", [0, 1], ids=["pointwise", "pairwise"])
def test_order_average_sums_to_one_exactly(model, pairs, kind):
    cfg, params = model
    pref = compiled(scorers(cfg)[kind], "preference")
    x, a, b = pairs
    p_ab, p_ba = np.asarray(pref(params, x, a, b)), np.asarray(pref(params, x, b, a))
    assert p_ab.dtype == np.float32
    np.testing.assert_array_equal(p_ab + p_ba, np.ones(4, np.float32))
    assert np.all(np.abs(p_ab - 0.5) > 1e-4), "the random head should tell the responses apart"


@settings(max_examples=60, deadline=None)
@given(d=hnp.arrays(np.float32, (2, 16), elements=st.floats(-60, 60, width=32)))
def test_averaged_preference_is_exactly_complementary(d):
    p, q = averaged_preference(d[0], d[1]), averaged_preference(d[1], d[0])
    np.testing.assert_array_equal(np.asarray(p) + np.asarray(q), np.ones(16, np.float32))
    np.testing.assert_allclose(p, jax.nn.sigmoid(0.5 * (d[0] - d[1])), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", [0, 1], ids=["pointwise", "pairwise"])
def test_symmetric_loss_unchanged_by_swapping_the_pair_and_flipping_the_label(model, pairs, kind):
    cfg, params = model
    deltas = compiled(scorers(cfg)[kind], "deltas")
    x, a, b = pairs
    r = jnp.array([1.0, 0.0, 1.0, 1.0])
    np.testing.assert_allclose(bt_loss(*deltas(params, x, a, b), r), bt_loss(*deltas(params, x, b, a), 1 - r),
                               rtol=1e-6)


def test_gradients_of_the_two_orders_combine_as_the_formula_says():
    """∇L_sym = ½ mean ∇ℓ_BT(Δ(x,a,b), r) + ½ mean ∇ℓ_BT(Δ(x,b,a), 1 − r), for the pairwise head."""
    cfg, policy = tiny_model("tiny", seed=3)
    params = from_policy(policy, cfg).replace(head=jax.random.normal(jax.random.key(4), (cfg.hidden_size,)))
    scorer = PairwiseScorer(cfg, PairTemplate.from_encoder(char_encode))
    x, a, b = (segment(random_rows(s, 3, 2, 8), 8) for s in (20, 21, 22))
    r = jnp.array([1.0, 0.0, 1.0])

    def losses(p):
        d_ab, d_ba = scorer.deltas(p, x, a, b)
        return bt_loss(d_ab, d_ba, r), bt_nll(d_ab, r).mean(), bt_nll(d_ba, 1 - r).mean()

    g_sym, g_ab, g_ba = jax.jit(lambda p: [jax.grad(lambda q: losses(q)[i])(p) for i in range(3)])(params)
    want = jax.tree.map(lambda u, v: 0.5 * u + 0.5 * v, g_ab, g_ba)
    # Whole-model fp32 at 1e-4 (CONVENTIONS), relative to each leaf's scale: the two sides sum the same terms in
    # another order, so an element near zero carries the rounding of the leaf's large terms (CI saw 6e-5 vs 6e-5
    # off by 6e-8, 1e-3 of itself but 1e-7 of the leaf).
    for (path, got), ref in zip(jax.tree_util.tree_leaves_with_path(g_sym), jax.tree.leaves(want)):
        scale = float(jnp.abs(ref).max())
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * scale, err_msg=jax.tree_util.keystr(path))
    assert float(jnp.abs(g_ab.head - g_ba.head).max()) > 1e-6, "the two orders should pull differently"


def test_specs_shardings_and_abstract_agree():
    cfg = tiny_config("tiny")
    mesh = make_mesh({"data": 2, "fsdp": -1})
    params = init_reward_params(cfg, jax.random.key(0), mesh=mesh)
    abstract = abstract_reward_params(cfg, mesh=mesh)
    shardings = reward_param_shardings(cfg, mesh)
    assert params.backbone.lm_head is None and params.head.shape == (cfg.hidden_size,)
    for p, s, sh in zip(jax.tree.leaves(params), jax.tree.leaves(abstract), jax.tree.leaves(shardings)):
        assert p.shape == s.shape and p.dtype == s.dtype and p.sharding == sh == s.sharding


@pytest.mark.parametrize("kind", [0, 1], ids=["pointwise", "pairwise"])
def test_checkpoint_round_trip(model, pairs, kind, tmp_path):
    cfg, params = model
    scorer = scorers(cfg)[kind]
    save_reward_model(tmp_path / "rm", params, scorer, max_shard_bytes=300_000)  # several backbone shards
    loaded, loaded_scorer = load_reward_model(tmp_path / "rm")
    assert loaded_scorer == scorer
    chex.assert_trees_all_equal(loaded, params)
    config = json.loads((tmp_path / "rm" / "config.json").read_text())
    assert config["num_labels"] == 1 and config["pad_token_id"] == PAD
    x, a, b = pairs
    deltas = compiled(scorer, "deltas")
    chex.assert_trees_all_equal(deltas(loaded, x, a, b), deltas(params, x, a, b))


def test_policy_checkpoint_is_refused_as_a_reward_model(model, tmp_path):
    from searchjax.model import CheckpointError, save_hf

    cfg, params = model
    save_hf(tmp_path / "policy", params.backbone.replace(lm_head=params.backbone.embed), cfg)
    with pytest.raises(CheckpointError, match="not a reward model checkpoint"):
        load_reward_model(tmp_path / "policy")


def hf_sequence_classifier():
    """transformers 5.x has no sequence-classification class for Qwen3.5 MoE; this is the composition it uses for
    its other architectures (e.g. Qwen3_5TextForSequenceClassification), over Qwen3_5MoeTextModel."""
    from transformers import Qwen3_5MoeTextConfig
    from transformers.modeling_layers import GenericForSequenceClassification
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoePreTrainedModel

    class Qwen3_5MoeTextForSequenceClassification(GenericForSequenceClassification, Qwen3_5MoePreTrainedModel):
        config_class = Qwen3_5MoeTextConfig

    return Qwen3_5MoeTextForSequenceClassification


def test_transformers_loads_the_checkpoint_and_gives_the_same_scores(tmp_path):
    import torch
    from tests.model.hf_reference import hf_model, save_per_expert

    cfg = tiny_config("tiny")
    _, policy = load_hf(save_per_expert(hf_model(cfg, seed=5), tmp_path / "policy"))  # weights of HF's scale
    params = from_policy(policy, cfg).replace(head=jax.random.normal(jax.random.key(6), (cfg.hidden_size,)))
    save_reward_model(tmp_path / "rm", params, PointwiseScorer(cfg))
    hf = hf_sequence_classifier().from_pretrained(tmp_path / "rm").eval()
    s = segment(random_rows(7, 3, 10, 50), 64)
    with torch.no_grad():
        ref = hf(torch.tensor(np.asarray(s.ids), dtype=torch.long)).logits[:, 0].numpy()
    ours = np.asarray(_values(params, s.ids, s.lengths, cfg))
    assert np.max(np.abs(ours - ref)) <= 1e-4 * np.max(np.abs(ref)), (ours, ref)
    assert np.std(ref) > 1e-3
