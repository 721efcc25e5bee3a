"""One record per rollout, its JSONL form, and the padded arrays the GRPO trainer consumes.

A record holds the full token sequence exactly as the trainer must see it (prompt ids, the sampled ids, the
tool-response ids; never a re-tokenisation of decoded text), with

    loss_mask[t] = 1  iff token t was sampled by the policy (0 on prompt, tool-response and harness tokens)
    logprobs[t]  = log μ_infer(tokens[t])  where loss_mask[t] = 1, else 0     (RECIPE.md §2)
    response_length = Σ_t loss_mask[t]       (|o_i|, the policy tokens)
    tool_calls = c_i, tool_failures = e_i    (RECIPE.md §4, tool-call efficiency)
    len(tokens) <= the engine's max_len      (also for finish_reason "context": the record fits the trainer's arrays)

and how it was sampled, for the trainer (the same temperature, top-p, top-k in log π; RECIPE.md §2) and for
replay: temperature, top_p, top_k; policy_version (the driver's weights version, −1 for the reference model);
key_impl and key_data (the rollout's typed PRNG key as data, `prng_key()` rebuilds it: turn t's request key is
fold_in(key, t), its n-th token fold_in(that, n)); budget = b, the search_web calls it could execute.

For a human reader (the arrays stay for training): question (the last user turn), turns (one
{text, tool_calls} per assistant turn: the decoded generation, and each call's {name, arguments, ok, error}),
answer; gold and r_base are left None for the caller (an evaluation or reward stage) to fill.

For routing replay (an engine with record_routes): routes [len(tokens), L, k] int16, the experts each token went
to in each MoE layer when the engine fed it (−1: not fed, e.g. harness tokens after the last turn). It is an
in-memory training input, not written to JSONL.

Fields added after the first release default to None, so older JSONL files still read (with those fields
None); a field of the wrong type is an error naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from searchjax.data import jsonl

POLICY = "policy"
REFERENCE = "reference"


@dataclasses.dataclass
class RolloutRecord:
    """One rollout (see module docstring). group_index is -1 for the reference model's rollout."""

    prompt_id: str
    group_index: int
    tokens: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_length: int
    tool_calls: int
    tool_failures: int
    response_length: int
    answer: str
    finish_reason: str
    model: str = POLICY
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    budget: int | None = None
    policy_version: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    key_impl: str | None = None
    key_data: list[int] | None = None
    question: str | None = None
    turns: list[dict[str, Any]] | None = None
    gold: Any = None
    r_base: float | None = None
    routes: Any = None  # np.ndarray [len(tokens), L, k] int16 (routing replay); in memory only, never in JSONL

    def prng_key(self) -> jax.Array:
        """The rollout's typed PRNG key, rebuilt from key_impl and key_data."""
        if self.key_data is None or self.key_impl is None:
            raise ValueError(f"record {self.prompt_id}/{self.group_index}: no key_data/key_impl (an older record)")
        return jax.random.wrap_key_data(np.asarray(self.key_data, np.uint32), impl=self.key_impl)

    def check(self) -> None:
        """Raise ValueError naming the field when the record is internally inconsistent or mistyped."""
        n = len(self.tokens)
        where = f"record {self.prompt_id}/{self.group_index}"
        for name, (kinds, described) in _OPTIONAL_TYPES.items():
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
                raise ValueError(f"{where}: field {name} must be {described} or null, got {value!r:.60}")
        if self.key_data is not None and not all(isinstance(x, int) and 0 <= x < 2**32 for x in self.key_data):
            raise ValueError(f"{where}: field key_data must be a list of uint32 ints, got {self.key_data!r:.60}")
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(f"{where}: tokens/loss_mask/logprobs lengths {n}/{len(self.loss_mask)}/{len(self.logprobs)}")
        if sum(self.loss_mask) != self.response_length:
            raise ValueError(f"{where}: response_length {self.response_length} != sum(loss_mask) {sum(self.loss_mask)}")
        if any(m == 0 and lp != 0.0 for m, lp in zip(self.loss_mask, self.logprobs)):
            raise ValueError(f"{where}: logprobs must be 0 where loss_mask is 0")
        if any(self.loss_mask[: self.prompt_length]):
            raise ValueError(f"{where}: loss_mask covers prompt tokens")
        if self.routes is not None and (np.ndim(self.routes) != 3 or len(self.routes) != n):
            raise ValueError(f"{where}: routes must be [len(tokens)={n}, layers, k], got shape {np.shape(self.routes)}")


_FIELDS = {f.name: f for f in dataclasses.fields(RolloutRecord)}
# The later fields' JSON types and how an error names them (gold may be any JSON value).
_INT, _NUMBER = ((int,), "an int"), ((int, float), "a number")
_OPTIONAL_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "budget": _INT, "policy_version": _INT, "temperature": _NUMBER, "top_p": _NUMBER, "top_k": _INT,
    "key_impl": ((str,), "a string"), "key_data": ((list,), "a list"), "question": ((str,), "a string"),
    "turns": ((list,), "a list"), "r_base": _NUMBER,
}


def record_from_dict(row: dict[str, Any]) -> RolloutRecord:
    """A RolloutRecord from its JSON object; unknown or missing fields raise naming them."""
    unknown = sorted(set(row) - set(_FIELDS))
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; valid: {sorted(_FIELDS)}")
    required = [n for n, f in _FIELDS.items() if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [n for n in required if n not in row]
    if missing:
        raise ValueError(f"missing field(s) {missing}")
    record = RolloutRecord(**row)
    record.check()
    return record


def write_jsonl(records: Iterable[RolloutRecord], path: str | Path) -> int:
    """Write one JSON object per record (without `routes`, an in-memory training input); returns the number."""
    rows = (dataclasses.asdict(dataclasses.replace(r, routes=None)) for r in records)
    return jsonl.write_jsonl(path, ({k: v for k, v in row.items() if k != "routes"} for row in rows))


def read_jsonl(path: str | Path) -> list[RolloutRecord]:
    """Read records back; a malformed line raises DataError("file:line: reason")."""
    return [record_from_dict(row) for row in jsonl.iter_jsonl(path, validate=_validate)]


def _validate(row: dict[str, Any]) -> None:
    record_from_dict(row)


def to_arrays(records: Sequence[RolloutRecord], max_len: int | None = None, *, pad_id: int) -> dict[str, np.ndarray]:
    """Right-padded arrays for the trainer, one row per record in the given order.

    tokens [N,L] int32 (pad_id after the end: pass the tokenizer's pad id, `tokenizer.special.pad`; it is
    required because id 0 is a real token), loss_mask [N,L] int32, logprobs [N,L] float32, lengths [N],
    prompt_lengths [N], response_length [N], tool_calls [N], tool_failures [N], group_index [N] int32, and
    prompt_id [N] (str); when any record has routes, routes [N,L,layers,k] int16 (−1 on padding and for the
    records without). L = max_len or the longest record. A record longer than max_len raises (never
    truncated silently). For the [N, G] layout of groups, pass `group_records(...).flat()`.
    """
    if not records:
        raise ValueError("to_arrays: no records")
    if isinstance(pad_id, bool) or not isinstance(pad_id, (int, np.integer)) or pad_id < 0:
        raise ValueError(f"to_arrays: pad_id must be a token id >= 0, got {pad_id!r}")
    longest = max(len(r.tokens) for r in records)
    width = longest if max_len is None else max_len
    too_long = [f"{r.prompt_id}/{r.group_index} ({len(r.tokens)})" for r in records if len(r.tokens) > width]
    if too_long:
        raise ValueError(f"to_arrays: records longer than max_len={width}: {too_long[:5]}")
    n = len(records)
    out = {
        "tokens": np.full((n, width), pad_id, np.int32),
        "loss_mask": np.zeros((n, width), np.int32),
        "logprobs": np.zeros((n, width), np.float32),
    }
    for i, r in enumerate(records):
        t = len(r.tokens)
        out["tokens"][i, :t] = r.tokens
        out["loss_mask"][i, :t] = r.loss_mask
        out["logprobs"][i, :t] = r.logprobs
    shapes = {np.shape(r.routes)[1:] for r in records if r.routes is not None}
    if len(shapes) > 1:
        raise ValueError(f"to_arrays: records with routes of different shapes {sorted(shapes)}")
    if shapes:
        out["routes"] = np.full((n, width, *shapes.pop()), -1, np.int16)
        for i, r in enumerate(records):
            if r.routes is not None:
                out["routes"][i, : len(r.tokens)] = r.routes
    for name, field in (("lengths", None), ("prompt_lengths", "prompt_length"), ("response_length", None),
                        ("tool_calls", None), ("tool_failures", None), ("group_index", None)):
        values = [len(r.tokens) if name == "lengths" else getattr(r, field or name) for r in records]
        out[name] = np.asarray(values, np.int32)
    out["prompt_id"] = np.asarray([r.prompt_id for r in records], dtype=str)
    return out


class RecordGroups(NamedTuple):
    """Records laid out as GRPO groups (RECIPE.md §2): N prompts × G policy rollouts, references apart.

    prompt_ids [N]; grid [N][G] with grid[n][i] the policy rollout of prompt_ids[n] with group_index i;
    reference [N] the reference-model rollout (group_index −1) of each prompt, or None when the records have
    none.
    """

    prompt_ids: tuple[str, ...]
    grid: tuple[tuple[RolloutRecord, ...], ...]
    reference: tuple[RolloutRecord, ...] | None

    def flat(self) -> list[RolloutRecord]:
        """The policy records in row-major order: flat()[n·G + i] = grid[n][i] (to_arrays rows → [N, G])."""
        return [r for row in self.grid for r in row]

    def field(self, name: str) -> np.ndarray:
        """A numeric record field (e.g. "tool_calls", "response_length") as an [N, G] array."""
        return np.asarray([[getattr(r, name) for r in row] for row in self.grid])

    def reference_field(self, name: str) -> np.ndarray:
        """A numeric field of the reference rollouts as an [N] array (e.g. L^ref = "response_length")."""
        if self.reference is None:
            raise ValueError(f"reference_field({name!r}): the records have no reference rollouts")
        return np.asarray([getattr(r, name) for r in self.reference])


def group_records(
    records: Iterable[RolloutRecord], group_size: int, prompt_ids: Sequence[str] | None = None
) -> RecordGroups:
    """Build the [N, G] grid from records in any order (e.g. as finished, or shuffled).

    Policy records must have group_index in [0, G) and model "policy"; reference records group_index −1 and
    model "reference", at most one per prompt, and then one for every prompt. Rows follow `prompt_ids` when
    given (every record's prompt must be listed), else the sorted prompt ids, so the grid does not depend on
    the order of `records`. A duplicate (prompt_id, group_index), a record of another kind, or a missing group
    member raises ValueError naming the records.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_records: group_size must be an int >= 1, got {group_size!r}")
    policy: dict[tuple[str, int], RolloutRecord] = {}
    reference: dict[str, RolloutRecord] = {}
    for r in records:
        kind = (r.model, r.group_index == -1)
        if kind not in ((POLICY, False), (REFERENCE, True)) or not -1 <= r.group_index < group_size:
            raise ValueError(
                f"group_records: record {r.prompt_id}/{r.group_index} (model {r.model!r}) is neither a policy "
                f"rollout with group_index in [0, {group_size}) nor a reference rollout with group_index -1"
            )
        table, key = (reference, r.prompt_id) if r.group_index == -1 else (policy, (r.prompt_id, r.group_index))
        if key in table:
            raise ValueError(f"group_records: duplicate record {r.prompt_id}/{r.group_index} (prompt_id/group_index)")
        table[key] = r
    seen = {p for p, _ in policy} | set(reference)
    order = tuple(sorted(seen)) if prompt_ids is None else tuple(prompt_ids)
    repeated = sorted({p for p in order if order.count(p) > 1})
    if repeated:
        raise ValueError(f"group_records: prompt_ids lists {repeated[:5]} more than once")
    unlisted = sorted(seen - set(order))
    if unlisted:
        raise ValueError(f"group_records: records of prompts not in prompt_ids: {unlisted[:5]}")
    missing = [f"{p}/{i}" for p in order for i in range(group_size) if (p, i) not in policy]
    if missing:
        raise ValueError(
            f"group_records: {len(missing)} missing group member(s) (prompt_id/group_index): {missing[:10]}"
        )
    if reference and len(reference) != len(order):
        absent = [p for p in order if p not in reference]
        raise ValueError(f"group_records: prompts without a reference rollout: {absent[:10]}")
    grid = tuple(tuple(policy[p, i] for i in range(group_size)) for p in order)
    return RecordGroups(order, grid, tuple(reference[p] for p in order) if reference else None)
