"""Rollout records without a model: padded arrays (prompt ids, the pad id) and the [N, G] grid of GRPO groups."""

import random

import numpy as np
import pytest

from searchjax.rollout import RolloutRecord, group_records, to_arrays

PAD = 7


def _record(prompt_id, group_index, n=5, prompt=3, model=None):
    """A consistent record: `prompt` prompt tokens, then n - prompt policy tokens (ids from the record's name)."""
    seed = 7 * sum(map(ord, prompt_id)) + group_index
    tokens = [(seed + t) % 50 + 10 for t in range(n)]
    mask = [0] * prompt + [1] * (n - prompt)
    return RolloutRecord(
        prompt_id=prompt_id, group_index=group_index, tokens=tokens, loss_mask=mask,
        logprobs=[-0.5 * m for m in mask], prompt_length=prompt, tool_calls=group_index % 3, tool_failures=0,
        response_length=sum(mask), answer="", finish_reason="answer",
        model=model or ("reference" if group_index < 0 else "policy"),
    )


def _batch(n_prompts=4, g=3, reference=True):
    ids = [f"q{p}" for p in range(n_prompts)]
    records = [_record(p, i, n=4 + (i + len(p)) % 4) for p in ids for i in range(g)]
    return ids, records + ([_record(p, -1, n=6) for p in ids] if reference else [])


def test_to_arrays_keeps_prompt_ids_and_pads_with_the_pad_id():
    _, records = _batch(2, 2, reference=False)
    arrays = to_arrays(records, pad_id=PAD)
    assert arrays["prompt_id"].tolist() == [r.prompt_id for r in records]
    for row, r in zip(arrays["tokens"], records):
        assert row[: len(r.tokens)].tolist() == r.tokens and (row[len(r.tokens) :] == PAD).all()
    assert (arrays["tokens"] == PAD).any() and not (arrays["tokens"] == 0).any()
    with pytest.raises(TypeError, match="pad_id"):
        to_arrays(records)  # no silent default: id 0 is a real token
    with pytest.raises(ValueError, match="pad_id"):
        to_arrays(records, pad_id=-1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_groups_are_rebuilt_exactly_from_shuffled_records(seed):
    ids, records = _batch()
    want = group_records(records, 3)
    shuffled = list(records)
    random.Random(seed).shuffle(shuffled)
    got = group_records(shuffled, 3)
    assert got == want and got.prompt_ids == tuple(ids)
    for n, row in enumerate(got.grid):
        assert [(r.prompt_id, r.group_index) for r in row] == [(ids[n], i) for i in range(3)]
    assert [r.prompt_id for r in got.reference] == ids and all(r.group_index == -1 for r in got.reference)
    # flat() rows reshape to [N, G] in the grid's order; field() gives the same layout.
    arrays = to_arrays(got.flat(), pad_id=PAD)
    np.testing.assert_array_equal(arrays["prompt_id"].reshape(4, 3), np.repeat(np.asarray(ids)[:, None], 3, 1))
    np.testing.assert_array_equal(arrays["group_index"].reshape(4, 3), np.tile(np.arange(3), (4, 1)))
    np.testing.assert_array_equal(got.field("response_length"), arrays["response_length"].reshape(4, 3))
    np.testing.assert_array_equal(got.reference_field("response_length"), [3] * 4)
    # An explicit prompt order is kept.
    assert group_records(shuffled, 3, prompt_ids=ids[::-1]).prompt_ids == tuple(ids[::-1])


def test_groups_without_reference_rows():
    _, records = _batch(reference=False)
    groups = group_records(records, 3)
    assert groups.reference is None
    with pytest.raises(ValueError, match="no reference"):
        groups.reference_field("response_length")


@pytest.mark.parametrize("edit, message", [
    (lambda rs: rs + [_record("q1", 2)], "duplicate record q1/2"),
    (lambda rs: rs + [_record("q2", -1)], "duplicate record q2/-1"),
    (lambda rs: [r for r in rs if (r.prompt_id, r.group_index) not in {("q1", 0), ("q3", 2)}],
     r"missing group member\(s\).*'q1/0', 'q3/2'"),
    (lambda rs: [r for r in rs if (r.prompt_id, r.group_index) != ("q2", -1)], r"without a reference.*'q2'"),
    (lambda rs: rs + [_record("q0", 3)], r"q0/3 .*group_index in \[0, 3\)"),
    (lambda rs: rs + [_record("q9", -1, model="policy")], "q9/-1"),
    (lambda rs: rs + [_record("q9", 0, model="reference")], "q9/0"),
])
def test_group_errors_name_the_records(edit, message):
    _, records = _batch()
    with pytest.raises(ValueError, match=message):
        group_records(edit(records), 3)


def test_group_prompt_order_errors():
    ids, records = _batch()
    with pytest.raises(ValueError, match=r"not in prompt_ids: \['q3'\]"):
        group_records(records, 3, prompt_ids=ids[:3])
    with pytest.raises(ValueError, match="more than once"):
        group_records(records, 3, prompt_ids=ids + ids[:1])
    with pytest.raises(ValueError, match="missing group member.*'q9/0'"):
        group_records(records, 3, prompt_ids=ids + ["q9"])
    with pytest.raises(ValueError, match="group_size"):
        group_records(records, 0)
