"""The Bradley–Terry reward model (RECIPE.md §4): the policy backbone with its LM head replaced by a value head.

    h   = hidden_states(backbone, tokens)          [B, T, D]  (final-normed; no lm_head)
    v_b = h[b, ℓ_b − 1] · w                        [B]        read at the last valid token, ℓ_b = lengths[b]

Every layer is causal (attention, the DeltaNet recurrence, its short convolution), so tokens after ℓ_b never
reach h[b, ℓ_b − 1] and right padding never changes a score.

Optionally (`likelihood=True`) the score adds the backbone's own log-likelihood of the response's assistant tokens,
with a learnt weight β (a scalar parameter, zero at the start):

    v_b = h[b, ℓ_b − 1] · w  +  β · Σ_t m[b, t] · log π(x_t | x_<t),   log π from the kept LM head (or the tied
                                                                         embedding), m the assistant-token mask

Why: a pair whose responses differ in one name (a correct answer against another question's answer of the same
type) is told apart by whether the name occurs in the search results earlier in the row. A policy that copies from
its context is surprised by the wrong name (its own likelihood picks the right response on every held-out
correctness pair, tools/likelihood_prefs.py), but nothing makes the last token's hidden state carry that surprise,
and a value head alone stayed at chance there (RESULTS.md "Reward model"). The sum is the implicit reward of DPO
without its reference term; the mask leaves out tool responses, whose likelihood is the search engine's, not the
policy's. The LM head is then a reward-model parameter (saved as lm_head.weight, trained by the loss); transformers'
sequence-classification class ignores it and β, so it reproduces only the value-head part of such a model. The head w [D] is described by a `ParamSpec`
(logical axis "embed") like every backbone parameter, so its sharding and its initialiser derive the same way;
it starts at zero, so an untrained reward model scores every pair Δ = 0, P̄ = ½.

Two scorers produce Δ(x, a, b), the logit that response a is preferred to b for prompt x, through one interface
`scorer.delta(params, x, a, b)` over token `Segment`s (right-padded ids + lengths):

- `PointwiseScorer`: rows x‖a and x‖b, Δ(x, a, b) = v(x‖a) − v(x‖b) (order cannot matter); with the likelihood
  term, v includes each response's β · ℓ.
- `PairwiseScorer`: one row x‖A‖a‖B‖b‖E whose value is Δ(x, a, b) itself, in the template
  (`PAIR_TEMPLATE`, `PairTemplate`)

      x   the rendered prompt (system + user turns, up to and including the last user <|im_end|>\\n)
      A   "<|im_start|>system\\n[Response A]<|im_end|>\\n"
      a   the first response's rendered turns ("<|im_start|>assistant\\n…<|im_end|>\\n", tool turns included)
      B   "<|im_start|>system\\n[Response B]<|im_end|>\\n"
      b   the second response's rendered turns
      E   "<|im_start|>system\\n[Which response is better, A or B?]<|im_end|>\\n"

  Δ(x, b, a) is the value of x‖A‖b‖B‖a‖E and need not equal −Δ(x, a, b): that gap is the position bias.
  With the likelihood term the mask marks only the response in slot A, whose context is x‖A (the one in slot B is
  read after the other response, so its likelihood would reward copying that response's names). Each response sits
  in slot A exactly once, so with ℓ_k = β · ℓ_A(row k) and u_k the head's value of row k,

      Δ(x, a, b) = u₁ + ℓ₁ − ℓ₂,    Δ(x, b, a) = u₂ + ℓ₂ − ℓ₁,

  the likelihood part antisymmetric in (a, b) (position bias comes from the head alone), from the same two rows.

`scorer.deltas(params, x, a, b)` returns both orders (Δ_ab, Δ_ba) from ONE forward over the 2B rows; the
symmetric loss `bt_loss(Δ_ab, Δ_ba, r)` and the order average (RECIPE.md §4)

    Δ̄(x, a, b) = ½[Δ(x, a, b) − Δ(x, b, a)],   P̄(x, a, b) = σ(Δ̄)

hold for either scorer. `scorer.preference` evaluates P̄ so that P̄(x, a, b) + P̄(x, b, a) = 1 exactly (see
`averaged_preference`).

Checkpoints (`save_reward_model` / `load_reward_model`) are Hugging Face directories: the backbone as `save_hf`
writes it (without lm_head), the head as `score.weight` [1, D] (transformers' GenericForSequenceClassification
layout, num_labels = 1), an index listing both, and config.json with the scorer under "searchjax_reward_model".
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, SingleDeviceSharding
from safetensors import safe_open
from safetensors.numpy import save_file

from searchjax.model.config import FULL, LINEAR, ModelConfig
from searchjax.model.hf import (
    SAFETENSORS_INDEX,
    SAFETENSORS_SINGLE,
    CheckpointError,
    _load_stacked,
    _make_array,
    _Reader,
    read_hf_config,
    save_hf,
)
from searchjax.model.params import ParamSpec, Params, abstract_params, init_params, param_specs
from searchjax.losses.logprobs import token_logprobs
from searchjax.model.transformer import hidden_states
from searchjax.rewards.bradley_terry import bt_preference, pairwise_deltas, pointwise_deltas
from searchjax.sharding import logical_sharding

F32 = jnp.float32
HEAD_TENSOR = "score.weight"
WEIGHT_TENSOR = "score.likelihood_weight"
HEAD_FILE = "score.safetensors"
CONFIG_KEY = "searchjax_reward_model"
HF_ARCHITECTURE = "Qwen3_5MoeTextForSequenceClassification"
SCORER_KINDS = ("pointwise", "pairwise")

# The pairwise template's markers (module docstring); PairTemplate holds their token ids.
PAIR_TEMPLATE = {
    "a": "<|im_start|>system\n[Response A]<|im_end|>\n",
    "b": "<|im_start|>system\n[Response B]<|im_end|>\n",
    "end": "<|im_start|>system\n[Which response is better, A or B?]<|im_end|>\n",
}


# ------------------------------------------------------------------------------------------------- parameters
@struct.dataclass
class RewardParams:
    """The reward model: `backbone` (Params; lm_head None unless the likelihood term needs it), the value head
    `head` [D], and the likelihood weight β [] (None without the likelihood term)."""

    backbone: Params
    head: Any
    likelihood_weight: Any = None


def _is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


_WEIGHT_SPEC = ParamSpec((), (), "zeros", "float32")  # β, the likelihood term's weight (a scalar)


def reward_specs(cfg: ModelConfig, likelihood: bool = False) -> RewardParams:
    """The RewardParams pytree with a ParamSpec at every leaf: the backbone's (lm_head only with the likelihood
    term), the head's and β's (with the likelihood term)."""
    backbone = param_specs(cfg)
    return RewardParams(backbone=backbone if likelihood else backbone.replace(lm_head=None),
                        head=ParamSpec((cfg.hidden_size,), ("embed",), "zeros"),
                        likelihood_weight=_WEIGHT_SPEC if likelihood else None)


def reward_param_shardings(cfg: ModelConfig, mesh: Mesh, likelihood: bool = False) -> RewardParams:
    """NamedSharding of every reward-model parameter on `mesh`, from its logical axes."""
    return jax.tree.map(lambda s: logical_sharding(mesh, s.axes, s.shape), reward_specs(cfg, likelihood),
                        is_leaf=_is_spec)


def _abstract(spec: ParamSpec, dtype, mesh: Mesh | None) -> jax.ShapeDtypeStruct:
    sharding = logical_sharding(mesh, spec.axes, spec.shape) if mesh is not None else None
    return jax.ShapeDtypeStruct(spec.shape, jnp.dtype(spec.dtype or dtype), sharding=sharding)


def abstract_reward_params(cfg: ModelConfig, dtype="float32", mesh: Mesh | None = None,
                           likelihood: bool = False) -> RewardParams:
    """ShapeDtypeStructs of every reward-model parameter (with shardings when `mesh` is given)."""
    specs = reward_specs(cfg, likelihood)
    backbone = abstract_params(cfg, dtype, mesh)
    return RewardParams(backbone=backbone if likelihood else backbone.replace(lm_head=None),
                        head=_abstract(specs.head, dtype, mesh),
                        likelihood_weight=_abstract(_WEIGHT_SPEC, dtype, mesh) if likelihood else None)


def _zeros(spec: ParamSpec, dtype, mesh: Mesh | None) -> jax.Array:
    out = logical_sharding(mesh, spec.axes, spec.shape) if mesh is not None else None
    return jax.jit(lambda: jnp.zeros(spec.shape, jnp.dtype(spec.dtype or dtype)), out_shardings=out)()


def from_policy(policy: Params, cfg: ModelConfig, dtype="float32", mesh: Mesh | None = None,
                likelihood: bool = False) -> RewardParams:
    """A reward model starting from a policy: its backbone (lm_head dropped unless `likelihood`), a zero value
    head, and β = 0 with the likelihood term (so an untrained model scores every pair Δ = 0 either way)."""
    return RewardParams(backbone=policy if likelihood else policy.replace(lm_head=None),
                        head=_zeros(reward_specs(cfg).head, dtype, mesh),
                        likelihood_weight=_zeros(_WEIGHT_SPEC, dtype, mesh) if likelihood else None)


def init_reward_params(cfg: ModelConfig, key: jax.Array, dtype="float32", mesh: Mesh | None = None,
                       likelihood: bool = False) -> RewardParams:
    """A randomly initialised backbone (`init_params`) with a zero head, created sharded when `mesh` is given."""
    return from_policy(init_params(cfg, key, dtype, mesh), cfg, dtype, mesh, likelihood)


# ------------------------------------------------------------------------------------------------------ values
def masked_loglik(backbone: Params, h: jax.Array, tokens: jax.Array, mask: jax.Array, chunk: int = 4096):
    """Σ_t mask[b, t] · log π(tokens[b, t] | tokens[b, <t]), float32 [B], from final hidden states h [B, T, D]
    (the chunked log-prob path: never a [B, T, V] array). mask[:, 0] is ignored (no token predicts position 0)."""
    logp = token_logprobs(h[:, :-1], backbone.unembed, tokens[:, 1:], chunk=chunk)  # [B, T-1]: predicts t + 1
    return jnp.sum(jnp.where(mask[:, 1:] > 0, logp, 0.0), axis=1)


def values(params: RewardParams, tokens: jax.Array, lengths: jax.Array, cfg: ModelConfig, *,
           mask: jax.Array | None = None, remat: bool = False, return_aux: bool = False, parts: bool = False):
    """v_b = h[b, ℓ_b − 1] · w (+ β · Σ_t m[b, t] log π with the likelihood term, module docstring): float32 [B]
    for right-padded int32 tokens [B, T] with ℓ = lengths [B] ≥ 1.

    mask [B, T] (int or bool): the assistant tokens whose log-likelihood the likelihood term sums; required when
    `params.likelihood_weight` is set, ignored otherwise (positions at or past ℓ_b must be 0). With parts=True
    returns (v, l): v as above and l [B] its likelihood part β · Σ m log π (zeros without the term), which the
    pairwise scorer combines across rows. With return_aux=True returns (that, aux) with aux["router_aux_loss"] as
    `hidden_states` gives it over the valid tokens only. A row with length 0 is padding: its value means nothing.
    """
    valid = jnp.arange(tokens.shape[1])[None] < lengths[:, None]
    out = hidden_states(params.backbone, tokens, cfg, remat=remat, return_aux=return_aux, valid=valid)
    h, aux = out if return_aux else (out, None)
    last = jnp.clip(lengths.astype(jnp.int32) - 1, 0, tokens.shape[1] - 1)
    h_last = jnp.take_along_axis(h, last[:, None, None], axis=1)[:, 0]  # [B, D]
    v = jnp.einsum("BD,D->B", h_last, params.head.astype(h_last.dtype), preferred_element_type=F32)
    lik = jnp.zeros_like(v)
    if params.likelihood_weight is not None:
        if mask is None:
            raise ValueError("values: this reward model has the likelihood term; pass the assistant-token mask")
        if mask.shape != tokens.shape:
            raise ValueError(f"values: mask shape {mask.shape} differs from tokens {tokens.shape}")
        lik = params.likelihood_weight.astype(F32) * masked_loglik(params.backbone, h, tokens,
                                                                    (jnp.asarray(mask) > 0) & valid)
        v = v + lik
    result = (v, lik) if parts else v
    return (result, aux) if return_aux else result


# ---------------------------------------------------------------------------------------------------- segments
@struct.dataclass
class Segment:
    """A batch of token sequences: ids int32 [B, T], right-padded; lengths int32 [B] (valid prefix of each row);
    mask int32 [B, T] or None: the assistant tokens (a response's, for the likelihood term; None = none)."""

    ids: jax.Array
    lengths: jax.Array
    mask: Any = None


def constant_segment(ids: tuple[int, ...], batch: int) -> Segment:
    """The same token sequence `ids` in every one of `batch` rows (a template marker)."""
    row = jnp.asarray(ids, jnp.int32)
    return Segment(jnp.broadcast_to(row, (batch, len(ids))), jnp.full((batch,), len(ids), jnp.int32))


def concat(segments: list[Segment], pad_id: int) -> Segment:
    """Row-wise concatenation of the valid parts: row b = s₁[b, :ℓ₁] ‖ s₂[b, :ℓ₂] ‖ …, right-padded with pad_id
    to the static width Σ T_k; the masks the same way (0 for a segment without one), or None if none has one."""
    batch = segments[0].ids.shape[0]
    width = sum(s.ids.shape[1] for s in segments)
    out = jnp.full((batch, width), pad_id, jnp.int32)
    masked = any(s.mask is not None for s in segments)
    mask = jnp.zeros((batch, width), jnp.int32)
    start = jnp.zeros((batch,), jnp.int32)
    rows = jnp.arange(batch)[:, None]
    for s in segments:
        t = jnp.arange(s.ids.shape[1], dtype=jnp.int32)[None]
        lengths = s.lengths.astype(jnp.int32)
        pos = jnp.where(t < lengths[:, None], start[:, None] + t, width)  # width is out of range: dropped
        out = out.at[rows, pos].set(s.ids.astype(jnp.int32), mode="drop")
        if s.mask is not None:
            mask = mask.at[rows, pos].set(jnp.asarray(s.mask, jnp.int32), mode="drop")
        start = start + lengths
    return Segment(out, start, mask if masked else None)


def _pad_to(s: Segment, width: int, pad_id: int) -> Segment:
    extra = width - s.ids.shape[1]
    if not extra:
        return s
    mask = None if s.mask is None else jnp.pad(s.mask, ((0, 0), (0, extra)))
    return Segment(jnp.pad(s.ids, ((0, 0), (0, extra)), constant_values=pad_id), s.lengths, mask)


def _lex_greater(a: Segment, b: Segment) -> jax.Array:
    """[B] bool: row a[b] comes after row b[b] in lexicographic order of the valid tokens (a prefix first)."""
    width = max(a.ids.shape[1], b.ids.shape[1]) + 1

    def keyed(s):  # valid ids, then -1 (below every id) from the end of the sequence on
        s = _pad_to(s, width, -1)
        return jnp.where(jnp.arange(width)[None] < s.lengths[:, None], s.ids, -1)

    ka, kb = keyed(a), keyed(b)
    first = jnp.argmax(ka != kb, axis=1)
    at = lambda k: jnp.take_along_axis(k, first[:, None], axis=1)[:, 0]  # noqa: E731
    return at(ka) > at(kb)


def _where(cond: jax.Array, s: Segment, t: Segment) -> Segment:
    width = max(s.ids.shape[1], t.ids.shape[1])
    s, t = _pad_to(s, width, 0), _pad_to(t, width, 0)
    mask = None
    if s.mask is not None and t.mask is not None:
        mask = jnp.where(cond[:, None], s.mask, t.mask)
    return Segment(jnp.where(cond[:, None], s.ids, t.ids), jnp.where(cond, s.lengths, t.lengths), mask)


# ------------------------------------------------------------------------------------------------- preference
def averaged_preference(delta_ab: jax.Array, delta_ba: jax.Array) -> jax.Array:
    """P̄ = σ(Δ̄), Δ̄ = ½[Δ(x, a, b) − Δ(x, b, a)] (RECIPE.md §4), with P̄(a, b) + P̄(b, a) = 1 exactly in float32.

    `bt_preference` computes σ(Δ̄) directly, and σ(Δ̄) + σ(−Δ̄) is off 1 by an ulp for about one pair in seven.
    Here Δ̄ ≤ 0 takes p = σ(Δ̄) and Δ̄ > 0 takes 1 − σ(−Δ̄). Swapping a and b negates Δ̄ exactly, so the two
    orders are p and fl(1 − p) of the same p ≤ ½, and p + fl(1 − p) rounds to exactly 1 (|fl(1 − p) − (1 − p)|
    ≤ 2⁻²⁵, half an ulp of 1 or less, which rounds to 1, ties to even).
    """
    p_ab, p_ba = bt_preference(delta_ab, delta_ba), bt_preference(delta_ba, delta_ab)
    return jnp.where(jnp.asarray(delta_ab, F32) - jnp.asarray(delta_ba, F32) <= 0, p_ab, 1.0 - p_ba)


@dataclasses.dataclass(frozen=True)
class PairTemplate:
    """Token ids of the pairwise template's markers A, B and E (PAIR_TEMPLATE, module docstring)."""

    a: tuple[int, ...]
    b: tuple[int, ...]
    end: tuple[int, ...]

    @classmethod
    def from_encoder(cls, encode) -> "PairTemplate":
        """The markers of PAIR_TEMPLATE through `encode(text) -> ids` (a tokenizer's encode)."""
        return cls(*(tuple(int(i) for i in encode(PAIR_TEMPLATE[k])) for k in ("a", "b", "end")))


def _unmasked(piece):
    """A row piece whose tokens the likelihood term must not read: a Segment without its mask (ids lists as they
    are: host-side masks are laid out by `mask_rows`)."""
    return piece.replace(mask=None) if isinstance(piece, Segment) else piece


class Scorer:
    """Δ(x, a, b) from a reward model over token Segments (module docstring); subclasses define the rows.

    `rows(x, a, b, marks)` lists the pieces of the two rows one forward computes, for any piece type: device
    Segments with `marks(batch)`, id lists with `template` (the host-side `PreferenceScorer` and the training
    batches); `mask_rows` the two rows' assistant masks for the likelihood term (host side); `combine` turns the
    rows' values and likelihood parts into (Δ(x, a, b), Δ(x, b, a)).
    """

    cfg: ModelConfig
    kind: str
    template: PairTemplate | None  # the pairwise markers' ids (None for the pointwise scorer)
    likelihood: bool  # the score adds β · a response's log-likelihood (module docstring)

    @property
    def pad_id(self) -> int:
        if self.cfg.pad_token_id is None:
            raise ValueError("reward model: ModelConfig.pad_token_id is None; set it to the tokenizer's pad id")
        return self.cfg.pad_token_id

    def marks(self, batch: int) -> PairTemplate | None:
        return None

    def rows(self, x, a, b, marks) -> tuple[list, list]:
        raise NotImplementedError

    def mask_rows(self, x_len: int, mask_a, mask_b) -> tuple[list[int], list[int]]:
        """The two rows' assistant masks (int lists as long as the rows of `rows`) for a prompt of x_len tokens
        and responses with assistant masks mask_a, mask_b: the tokens whose log-likelihood the term sums."""
        raise NotImplementedError

    def combine(self, v_first: jax.Array, v_second: jax.Array, lik_first: jax.Array,
                lik_second: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(Δ(x, a, b), Δ(x, b, a)) from the two rows' values v and their likelihood parts (`values(parts=True)`)."""
        raise NotImplementedError

    def deltas(self, params: RewardParams, x: Segment, a: Segment, b: Segment, *, remat: bool = False,
               return_aux: bool = False):
        """(Δ(x, a, b), Δ(x, b, a)), float32 [B] each, from one forward over the 2B rows of `rows`.

        With return_aux=True returns ((Δ_ab, Δ_ba), aux) as `values` gives aux.
        """
        batch = x.ids.shape[0]
        if self.likelihood and (a.mask is None or b.mask is None):
            raise ValueError("the likelihood term needs the responses' assistant masks (Segment.mask of a and b)")
        first, second = (concat(r, self.pad_id) for r in self.rows(x, a, b, self.marks(batch)))
        width = max(first.ids.shape[1], second.ids.shape[1])
        first, second = _pad_to(first, width, self.pad_id), _pad_to(second, width, self.pad_id)
        tokens = jnp.concatenate([first.ids, second.ids])
        lengths = jnp.concatenate([first.lengths, second.lengths])
        mask = jnp.concatenate([first.mask, second.mask]) if self.likelihood else None
        return self.row_deltas(params, tokens, lengths, mask, remat=remat, return_aux=return_aux)

    def row_deltas(self, params: RewardParams, tokens: jax.Array, lengths: jax.Array, mask: jax.Array | None = None,
                   *, remat: bool = False, return_aux: bool = False, parts: bool = False):
        """(Δ(x, a, b), Δ(x, b, a)), float32 [B] each, from one forward over 2B rows already laid out: tokens
        [2B, W] holds the B pairs' first rows of `rows`, then their B second rows; lengths [2B]; mask [2B, W] the
        rows' assistant masks of `mask_rows` (the likelihood term; None without it). With return_aux=True returns
        ((Δ_ab, Δ_ba), aux) as `values` gives aux. With parts=True the tuple gains a third entry, the likelihood
        part of the order average Δ̄(x, a, b) = ½[Δ(x, a, b) − Δ(x, b, a)]: β · (ℓ_a − ℓ_b) for either scorer
        (pointwise: Δ̄ = u_a − u_b + β(ℓ_a − ℓ_b); pairwise: Δ̄ = ½(u₁ − u₂) + β(ℓ_a − ℓ_b), module docstring), so
        Δ̄ minus it is the value head's part; zeros without the likelihood term.
        """
        out = values(params, tokens, lengths, self.cfg, mask=mask, remat=remat, return_aux=return_aux, parts=True)
        (v, lik), aux = out if return_aux else (out, None)
        n = tokens.shape[0] // 2
        d = self.combine(v[:n], v[n:], lik[:n], lik[n:])
        if parts:
            d = (*d, lik[:n] - lik[n:])
        return (d, aux) if return_aux else d

    def delta(self, params: RewardParams, x: Segment, a: Segment, b: Segment) -> jax.Array:
        """Δ(x, a, b), float32 [B]: the logit that a is preferred to b."""
        return self.deltas(params, x, a, b)[0]

    def preference(self, params: RewardParams, x: Segment, a: Segment, b: Segment) -> jax.Array:
        """P̄(x, a, b) = σ(½[Δ(x, a, b) − Δ(x, b, a)]), float32 [B], with P̄(x, a, b) + P̄(x, b, a) = 1 exactly.

        Each pair is scored in a canonical order (the lexicographically smaller response first), so both
        orders of a pair run the identical forward and `averaged_preference` makes the sum exact.
        """
        swap = _lex_greater(a, b)
        d_ab, d_ba = self.deltas(params, x, _where(swap, b, a), _where(swap, a, b))
        return averaged_preference(jnp.where(swap, d_ba, d_ab), jnp.where(swap, d_ab, d_ba))


@dataclasses.dataclass(frozen=True)
class PointwiseScorer(Scorer):
    """Δ(x, a, b) = s(x, a) − s(x, b), each response scored on its own sequence x‖a (with `likelihood`, s includes
    β · the response's log-likelihood)."""

    cfg: ModelConfig
    likelihood: bool = False
    kind = "pointwise"
    template = None

    def rows(self, x, a, b, marks):
        return [x, a], [x, b]

    def mask_rows(self, x_len, mask_a, mask_b):
        return [0] * x_len + [int(m) for m in mask_a], [0] * x_len + [int(m) for m in mask_b]

    def combine(self, v_first, v_second, lik_first, lik_second):
        return pointwise_deltas(v_first, v_second)


@dataclasses.dataclass(frozen=True)
class PairwiseScorer(Scorer):
    """Δ(x, a, b) = v(x‖A‖a‖B‖b‖E): the head reads the pair in order (template: module docstring); with
    `likelihood`, plus β · [ℓ_A(x‖A‖a…) − ℓ_A(x‖A‖b…)], the slot-A responses' log-likelihoods."""

    cfg: ModelConfig
    template: PairTemplate
    likelihood: bool = False
    kind = "pairwise"

    def marks(self, batch: int):
        t = self.template
        return PairTemplate(*(constant_segment(ids, batch) for ids in (t.a, t.b, t.end)))

    def rows(self, x, a, b, marks):
        return ([x, marks.a, a, marks.b, _unmasked(b), marks.end],
                [x, marks.a, b, marks.b, _unmasked(a), marks.end])

    def mask_rows(self, x_len, mask_a, mask_b):
        t = self.template
        row = lambda first, second: ([0] * (x_len + len(t.a)) + [int(m) for m in first]  # noqa: E731
                                     + [0] * (len(t.b) + len(second) + len(t.end)))
        return row(mask_a, mask_b), row(mask_b, mask_a)

    def combine(self, v_first, v_second, lik_first, lik_second):
        d_ab, d_ba = pairwise_deltas(v_first, v_second)
        return d_ab - lik_second, d_ba - lik_first


def make_scorer(kind: str, cfg: ModelConfig, template: PairTemplate | None = None,
                likelihood: bool = False) -> Scorer:
    """The scorer of `kind` ("pointwise" or "pairwise"; the pairwise one needs its template); `likelihood` adds
    the response log-likelihood term (module docstring)."""
    if kind == "pointwise":
        return PointwiseScorer(cfg, likelihood)
    if kind == "pairwise":
        if template is None:
            raise ValueError("the pairwise scorer needs a PairTemplate (PairTemplate.from_encoder(tokenizer.encode))")
        return PairwiseScorer(cfg, template, likelihood)
    raise ValueError(f"unknown scorer kind {kind!r}; expected one of {list(SCORER_KINDS)}")


# ------------------------------------------------------------------------------------------------ checkpoints
def _scorer_meta(scorer: Scorer) -> dict[str, Any]:
    meta: dict[str, Any] = {"scorer": scorer.kind, "likelihood": scorer.likelihood}
    if isinstance(scorer, PairwiseScorer):
        meta["template"] = {"text": dict(PAIR_TEMPLATE), **{k: list(getattr(scorer.template, k))
                                                             for k in ("a", "b", "end")}}
    return meta


def _write_head_and_index(path: Path, head: np.ndarray, weight: np.ndarray | None) -> None:
    """score.weight (and β as score.likelihood_weight [1]) into their own file, and an index naming every
    tensor's file (the single-file layout of save_hf is renamed first: transformers reads model.safetensors in
    preference to an index)."""
    tensors = {HEAD_TENSOR: np.ascontiguousarray(head[None, :])}
    if weight is not None:
        tensors[WEIGHT_TENSOR] = np.asarray(weight, np.float32).reshape(1)
    save_file(tensors, str(path / HEAD_FILE), metadata={"format": "pt"})
    index_path = path / SAFETENSORS_INDEX
    if index_path.exists():
        index = json.loads(index_path.read_text())
    else:
        single = path / "model-00001.safetensors"
        os.replace(path / SAFETENSORS_SINGLE, single)
        with safe_open(single, framework="numpy") as f:
            index = {"metadata": {}, "weight_map": {name: single.name for name in f.keys()}}
    for name in tensors:
        index["weight_map"][name] = HEAD_FILE
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    index["metadata"]["total_size"] = sum((path / f).stat().st_size for f in set(index["weight_map"].values()))
    index_path.write_text(json.dumps(index, indent=2))


def save_reward_model(path: str | os.PathLike, params: RewardParams, scorer: Scorer,
                      max_shard_bytes: int = 4 << 30) -> None:
    """Write the reward model as an HF directory (module docstring): backbone, `score.weight` [1, D], index and
    config.json (architectures [HF_ARCHITECTURE], num_labels 1, pad_token_id, the scorer)."""
    path = Path(path)
    cfg = scorer.cfg
    save_hf(path, params.backbone if scorer.likelihood else params.backbone.replace(lm_head=None), cfg,
            max_shard_bytes)
    weight = None if params.likelihood_weight is None else np.asarray(params.likelihood_weight)
    if (weight is not None) != scorer.likelihood:
        raise ValueError(f"save_reward_model: the scorer's likelihood={scorer.likelihood} does not match the params "
                         f"(likelihood_weight {'set' if weight is not None else 'None'})")
    _write_head_and_index(path, np.asarray(params.head), weight)
    config = json.loads((path / "config.json").read_text())
    config.update(architectures=[HF_ARCHITECTURE], num_labels=1, id2label={"0": "LABEL_0"},
                  label2id={"LABEL_0": 0}, pad_token_id=scorer.pad_id, **{CONFIG_KEY: _scorer_meta(scorer)})
    (path / "config.json").write_text(json.dumps(config, indent=2))


def read_scorer(path: str | os.PathLike, cfg: ModelConfig) -> Scorer:
    """The scorer a reward-model checkpoint's config.json records (CheckpointError for any other directory)."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    meta = config.get(CONFIG_KEY)
    if not isinstance(meta, dict) or meta.get("scorer") not in SCORER_KINDS:
        raise CheckpointError(f"{path / 'config.json'}: not a reward model checkpoint (no {CONFIG_KEY!r} with a "
                              f"'scorer' in {list(SCORER_KINDS)}); start one from a policy with from_policy")
    template = None
    if meta["scorer"] == "pairwise":
        t = meta.get("template")
        if not isinstance(t, dict) or not all(isinstance(t.get(k), list) for k in ("a", "b", "end")):
            raise CheckpointError(f"{path / 'config.json'}: {CONFIG_KEY}.template needs id lists 'a', 'b', 'end'")
        template = PairTemplate(*(tuple(int(i) for i in t[k]) for k in ("a", "b", "end")))
    return make_scorer(meta["scorer"], cfg, template, bool(meta.get("likelihood", False)))


def load_reward_model(path: str | os.PathLike, dtype="float32",
                      mesh: Mesh | None = None) -> tuple[RewardParams, Scorer]:
    """(params, scorer) of a directory written by `save_reward_model`, parameters created in their shardings.

    The backbone is read as `load_hf` reads it (each device's shard reads only its own layers and experts),
    without an lm_head; `scorer.cfg` is the checkpoint's ModelConfig.
    """
    path = Path(path)
    cfg = read_hf_config(path)
    scorer = read_scorer(path, cfg)
    reader = _Reader(path)
    specs = reward_specs(cfg, scorer.likelihood)
    if mesh is not None:
        shardings = reward_param_shardings(cfg, mesh, scorer.likelihood)
    else:
        one = SingleDeviceSharding(jax.devices()[0])
        shardings = jax.tree.map(lambda s: one, specs, is_leaf=_is_spec)

    def whole(name, spec, sharding, shape):
        return _make_array(spec, sharding, dtype, lambda idx: reader.get(name, shape)[idx])

    d, v = cfg.hidden_size, cfg.vocab_size
    bb, sh = specs.backbone, shardings.backbone
    backbone = Params(
        embed=whole(reader.prefix + "embed_tokens.weight", bb.embed, sh.embed, (v, d)),
        lm_head=None if bb.lm_head is None else whole("lm_head.weight", bb.lm_head, sh.lm_head, (v, d)),
        final_norm=whole(reader.prefix + "norm.weight", bb.final_norm, sh.final_norm, (d,)),
        linear=_load_stacked(reader, cfg, LINEAR, bb.linear, sh.linear, dtype),
        full=_load_stacked(reader, cfg, FULL, bb.full, sh.full, dtype),
    )
    head = _make_array(specs.head, shardings.head, dtype, lambda idx: reader.get(HEAD_TENSOR, (1, d))[0][idx])
    weight = None
    if scorer.likelihood:
        weight = _make_array(specs.likelihood_weight, shardings.likelihood_weight, dtype,
                             lambda idx: reader.get(WEIGHT_TENSOR, (1,))[0])
    return RewardParams(backbone=backbone, head=head, likelihood_weight=weight), scorer

