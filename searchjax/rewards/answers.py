"""r_base ∈ {0, 1} (RECIPE.md §4): answer matching for verifiable QA and the all-rubrics-pass gate for chat.

QA: a prediction is correct when, for any alias of the gold answer,
  - its SQuAD-normalised text equals the alias's (lower case, punctuation — Unicode included — and the
    articles a/an/the removed, whitespace collapsed; punctuation read as a space or deleted), or
  - the alias is a bare number (currency signs, %, thousands separators allowed) and the prediction contains
    at least one number and every number in it agrees with the gold: |p − g| ≤ max(½·10^−d, rel_tol·|g|,
    abs_tol), d being the gold's decimal places (so "3.14159" matches "3.14", "2008" does not match "2007"), or
  - f1_threshold is set and the SQuAD token F1 with the alias reaches it.
A response is first reduced to its answer by `extract_answer` (the policy is trained to state it in one of the SFT
data's formats: "The answer is X.", a list with "**X** (the answer)", or a table whose last row ends with X), so
a correct answer in a sentence scores 1 and a hedge that names several candidates scores 0.
Host-side Python (strings), not jitted; the results feed `RolloutRecords.correct`.
"""

from __future__ import annotations

import collections
import re
import unicodedata
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from searchjax.rewards.config import RewardConfig

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NUMBER = re.compile(
    r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])|(?<![\w.])[-+]?\.\d+(?![\w])"
)
_NUMERIC_DECORATION = re.compile(r"[\s$€£¥%]")


def _strip_punctuation(text: str, joiner: str = " ") -> str:
    return "".join(joiner if unicodedata.category(ch).startswith("P") else ch for ch in text)


def normalize_answer(text: str, *, delete_punctuation: bool = False) -> str:
    """SQuAD normalisation: lower case, punctuation out, articles out, whitespace collapsed.

    By default a punctuation mark (any Unicode category P*) becomes a space, so "apple—pie" and "Paris/London"
    split into words; `delete_punctuation=True` drops it as the SQuAD script does, so "U.S." reads "us" and
    "co-founder" "cofounder". `exact_match` accepts either reading.
    """
    text = _strip_punctuation(text.lower(), "" if delete_punctuation else " ")
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> bool:
    """SQuAD exact match: the normalised strings are equal, with punctuation read as a space ("Jean-Paul" =
    "Jean Paul") or deleted as in the SQuAD script ("U.S." = "US", "co-founder" = "cofounder")."""
    return normalize_answer(prediction) == normalize_answer(gold) or normalize_answer(
        prediction, delete_punctuation=True) == normalize_answer(gold, delete_punctuation=True)


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD token F1 between normalised token bags (1.0 when both are empty, 0.0 when only one is)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    same = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def extract_numbers(text: str) -> list[tuple[float, float]]:
    """Every number in `text` as (value, half a unit of its last stated digit). "1,234.5" -> (1234.5, 0.05)."""
    out = []
    for match in _NUMBER.finditer(text):
        token = match.group(0).replace(",", "")
        mantissa, _, exponent = token.lower().partition("e")
        decimals = len(mantissa.partition(".")[2])
        half_ulp = 0.5 * 10.0 ** (int(exponent or 0) - decimals)
        out.append((float(token), half_ulp))
    return out


def _bare_number(gold: str) -> tuple[float, float] | None:
    """(value, half-ulp) if `gold` is one number with at most currency / % decoration, else None."""
    numbers = extract_numbers(gold)
    if len(numbers) != 1:
        return None
    rest = _NUMBER.sub("", gold, count=1)
    return numbers[0] if not _NUMERIC_DECORATION.sub("", rest) else None


def numbers_match(prediction: str, gold: str, *, rel_tol: float = 0.0, abs_tol: float = 0.0) -> bool:
    """True iff `gold` is a bare number and every number in `prediction` (at least one) agrees with it."""
    target = _bare_number(gold)
    found = extract_numbers(prediction)
    if target is None or not found:
        return False
    value, half_ulp = target
    tol = max(half_ulp, rel_tol * abs(value), abs_tol)
    # The relative slack absorbs binary rounding at the boundary (3.145 vs 3.14 ± 0.005).
    return all(abs(p - value) <= tol * (1 + 1e-9) for p, _ in found)


_STATED = re.compile(r"\bthe answer is\s+(.+?)\s*(?:\.\s*$|\.\s+|$)", re.IGNORECASE | re.DOTALL)
_MARKED = re.compile(r"\*\*(.+?)\*\*\s*\(the answer\)", re.IGNORECASE)
_TABLE_ROW = re.compile(r"^\s*\|(.+)\|\s*$")


def extract_answer(response: str) -> str:
    """The answer a response states (module docstring); the whole stripped response when it states none, or when
    it states several different ones (a hedge, which then matches no single gold answer).

        "The answer is Rob Fitzpatrick."             -> "Rob Fitzpatrick"
        "- The Mom Test\n- **Rob Fitzpatrick** (the answer)" -> "Rob Fitzpatrick"
        "| step | entity |\n|---|---|\n| 1 | A |\n| 2 | B |" -> "B"
    """
    text = response.strip()
    for pattern in (_STATED, _MARKED):
        found = {m.strip().strip("*").strip() for m in pattern.findall(text)}
        if len(found) == 1:
            return found.pop()
        if len(found) > 1:
            return text
    rows = [m.group(1) for line in text.splitlines() if (m := _TABLE_ROW.match(line))]
    body = [r for r in rows if not set(r.replace("|", "").strip()) <= set("-: ")]
    if len(body) >= 2:  # a header and at least one row: the answer closes the last row
        return body[-1].split("|")[-1].strip()
    return text


def qa_correct(response: str, answers: str | Sequence[str], **kwargs) -> bool:
    """QA r_base of a whole response: `answer_correct(extract_answer(response), answers, **kwargs)`."""
    return answer_correct(extract_answer(response), answers, **kwargs)


def answer_correct(
    prediction: str,
    answers: str | Sequence[str],
    *,
    rel_tol: float = 0.0,
    abs_tol: float = 0.0,
    f1_threshold: float | None = None,
) -> bool:
    """QA r_base: does `prediction` match any alias in `answers` (EM, numbers, optional F1; module docstring)."""
    aliases = [answers] if isinstance(answers, str) else list(answers)
    if not aliases or not all(isinstance(a, str) for a in aliases):
        raise ValueError(f"answer_correct: answers must be a non-empty str or list of str, got {answers!r}")
    for alias in aliases:
        if exact_match(prediction, alias) or numbers_match(prediction, alias, rel_tol=rel_tol, abs_tol=abs_tol):
            return True
        if f1_threshold is not None and token_f1(prediction, alias) >= f1_threshold:
            return True
    return False


def qa_r_base(
    predictions: Sequence[str], answers: Sequence[str | Sequence[str]], cfg: RewardConfig
) -> np.ndarray:
    """r_base for a flat batch of QA responses (answers extracted by `extract_answer`): float32
    [len(predictions)], tolerances from `cfg`."""
    if len(predictions) != len(answers):
        raise ValueError(f"qa_r_base: {len(predictions)} predictions but {len(answers)} answer lists")
    return np.array(
        [qa_correct(p, a, rel_tol=cfg.answer_rel_tol, abs_tol=cfg.answer_abs_tol,
                    f1_threshold=cfg.answer_f1_threshold) for p, a in zip(predictions, answers)],
        dtype=np.float32,
    )


def rubric_r_base(passed: Sequence[bool] | jax.Array, valid: jax.Array | None = None) -> jax.Array:
    """Rubric r_base = 1 iff every rubric passes (RECIPE.md §3.2, §4); reduces the last axis, float32.

    Args:
      passed: [..., R] booleans, one per rubric (a plain list for one response).
      valid: optional [..., R] mask for padded rubric sets; padded entries count as passing.
    Raises on an empty rubric set: with nothing to check the prompt is not a rubric prompt.
    """
    passed = jnp.asarray(passed, bool)
    if passed.ndim == 0 or passed.shape[-1] == 0:
        raise ValueError(f"rubric_r_base: expected a non-empty [..., R] rubric result, got shape {passed.shape}")
    if valid is not None:
        if jnp.shape(valid) != passed.shape:
            raise ValueError(f"rubric_r_base: valid shape {jnp.shape(valid)} must equal passed {passed.shape}")
        passed = passed | ~jnp.asarray(valid, bool)
    return passed.all(axis=-1).astype(jnp.float32)
