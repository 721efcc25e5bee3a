"""One record per rollout, its JSONL form, and the padded arrays the GRPO trainer consumes.

A record holds the full token sequence exactly as the trainer must see it (prompt ids, the sampled ids, the
tool-response ids; never a re-tokenisation of decoded text), with

    loss_mask[t] = 1  iff token t was sampled by the policy (0 on prompt, tool-response and harness tokens)
    logprobs[t]  = log μ_infer(tokens[t])  where loss_mask[t] = 1, else 0     (RECIPE.md §2)
    response_length = Σ_t loss_mask[t]       (|o_i|, the policy tokens)
    tool_calls = c_i, tool_failures = e_i    (RECIPE.md §4, tool-call efficiency)
    budget = b                               the search_web calls the rollout could execute

Fields added after the first release default to None, so older JSONL files still read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

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

    def check(self) -> None:
        """Raise ValueError naming the field when the record is internally inconsistent."""
        n = len(self.tokens)
        where = f"record {self.prompt_id}/{self.group_index}"
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(f"{where}: tokens/loss_mask/logprobs lengths {n}/{len(self.loss_mask)}/{len(self.logprobs)}")
        if sum(self.loss_mask) != self.response_length:
            raise ValueError(f"{where}: response_length {self.response_length} != sum(loss_mask) {sum(self.loss_mask)}")
        if any(m == 0 and lp != 0.0 for m, lp in zip(self.loss_mask, self.logprobs)):
            raise ValueError(f"{where}: logprobs must be 0 where loss_mask is 0")
        if any(self.loss_mask[: self.prompt_length]):
            raise ValueError(f"{where}: loss_mask covers prompt tokens")


_FIELDS = {f.name: f for f in dataclasses.fields(RolloutRecord)}


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
    """Write one JSON object per record; returns the number written."""
    return jsonl.write_jsonl(path, (dataclasses.asdict(r) for r in records))


def read_jsonl(path: str | Path) -> list[RolloutRecord]:
    """Read records back; a malformed line raises DataError("file:line: reason")."""
    return [record_from_dict(row) for row in jsonl.iter_jsonl(path, validate=_validate)]


def _validate(row: dict[str, Any]) -> None:
    record_from_dict(row)


def to_arrays(records: Sequence[RolloutRecord], max_len: int | None = None, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Right-padded arrays for the trainer.

    tokens [N,L] int32 (pad_id after the end), loss_mask [N,L] int32, logprobs [N,L] float32, lengths [N],
    prompt_lengths [N], response_length [N], tool_calls [N], tool_failures [N], group_index [N]; L = max_len or
    the longest record. A record longer than max_len raises (never truncated silently).
    """
    if not records:
        raise ValueError("to_arrays: no records")
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
    for name, field in (("lengths", None), ("prompt_lengths", "prompt_length"), ("response_length", None),
                        ("tool_calls", None), ("tool_failures", None), ("group_index", None)):
        values = [len(r.tokens) if name == "lengths" else getattr(r, field or name) for r in records]
        out[name] = np.asarray(values, np.int32)
    return out
