"""QA answer matching and the rubric gate (r_base, RECIPE.md §4)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.rewards import (
    RewardConfig,
    answer_correct,
    exact_match,
    normalize_answer,
    numbers_match,
    qa_r_base,
    rubric_r_base,
    token_f1,
)


def test_squad_normalisation():
    assert normalize_answer("The  Mom Test!") == "mom test"
    assert normalize_answer("“An” apple—pie.") == "apple pie"
    assert normalize_answer("Théâtre") == "théâtre"
    assert exact_match("the Mom Test", "Mom test.")
    assert not exact_match("Mom Tests", "Mom Test")
    # Punctuation read as a space or deleted (the SQuAD script's way): either reading may match.
    assert exact_match("U.S.", "US") and exact_match("co-founder", "cofounder")
    assert exact_match("Jean-Paul Sartre", "Jean Paul Sartre") and exact_match("apple—pie", "apple pie")
    assert normalize_answer("U.S.", delete_punctuation=True) == "us" and normalize_answer("U.S.") == "u s"
    assert not exact_match("U.S.", "UK")


def test_token_f1_by_hand():
    # pred tokens {rob, fitzpatrick, author}, gold {rob, fitzpatrick}: P = 2/3, R = 1, F1 = 0.8.
    assert token_f1("Rob Fitzpatrick, author", "Rob Fitzpatrick") == pytest.approx(0.8)
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0 and token_f1("a b", "c d") == 0.0


@pytest.mark.parametrize("pred, gold, ok", [
    ("3.14159", "3.14", True),  # agrees at the gold's precision
    ("3.2", "3.14", False),
    ("2008", "2007", False),
    ("2007.4", "2007", True),
    ("$1,234", "1234", True),
    ("about 1,234 people", "1,234", True),
    ("1234 or 1300", "1234", False),  # every number must agree
    ("12%", "12 %", True),
    ("1.5e3", "1500", True),
    ("-4", "4", False),
    ("World War 2", "2", True),
    ("2", "World War 2", False),  # the gold is not a bare number
    ("no number", "7", False),
])
def test_numbers(pred, gold, ok):
    assert numbers_match(pred, gold) is ok


def test_numeric_tolerances():
    assert not numbers_match("105", "100")
    assert numbers_match("105", "100", rel_tol=0.05)
    assert numbers_match("101", "100", abs_tol=1.0)


def test_alias_lists_and_f1_threshold():
    assert answer_correct("JFK", ["John F. Kennedy", "JFK"])
    assert not answer_correct("Kennedy", ["John F. Kennedy", "JFK"])
    assert answer_correct("John Kennedy", "John F. Kennedy", f1_threshold=0.75)
    assert not answer_correct("John Kennedy", "John F. Kennedy", f1_threshold=0.9)
    with pytest.raises(ValueError, match="non-empty"):
        answer_correct("x", [])


def test_qa_r_base_uses_config_tolerances():
    cfg = RewardConfig(answer_rel_tol=0.1, answer_f1_threshold=0.5)
    got = qa_r_base(["105", "the mom test", "nope"], ["100", ["The Mom Test"], "yes"], cfg)
    np.testing.assert_array_equal(got, [1.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="predictions"):
        qa_r_base(["a"], [], cfg)


@settings(max_examples=50, deadline=None)
@given(text=st.text(max_size=40))
def test_normalisation_is_idempotent_and_self_match(text):
    norm = normalize_answer(text)
    assert normalize_answer(norm) == norm
    assert answer_correct(text, text) or not norm  # everything matches itself unless it normalises to ""


def test_rubric_gate():
    assert float(rubric_r_base([True, True, True])) == 1.0
    assert float(rubric_r_base([True, False, True])) == 0.0
    passed = jnp.array([[True, False, True], [True, True, False]])
    valid = jnp.array([[True, False, True], [True, True, True]])
    np.testing.assert_array_equal(rubric_r_base(passed, valid), [1.0, 0.0])
    np.testing.assert_array_equal(jax.jit(rubric_r_base)(passed, valid), [1.0, 0.0])
    with pytest.raises(ValueError, match="non-empty"):
        rubric_r_base([])
