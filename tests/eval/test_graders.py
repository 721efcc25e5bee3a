"""Graders on hand-written cases: short-answer EM / F1, SimpleQA grades (all three), FRAMES, both back ends."""

import pytest

from searchjax.eval.graders import (
    CORRECT, FALSE, INCORRECT, NOT_ATTEMPTED, TRUE, LLMGrader, RuleGrader, is_abstention, short_answer_scores,
    simpleqa_f_score,
)
from searchjax.rewards.rubrics import ModelReplyError

RULE = RuleGrader()


def test_short_answers_use_the_reward_matching():
    assert short_answer_scores("The Eiffel Tower!", ["Eiffel Tower"]) == (True, 1.0)
    assert short_answer_scores("Big Apple", ["New York City", "Big Apple"]) == (True, 1.0)
    assert short_answer_scores("3.14159", ["3.14"])[0] and not short_answer_scores("2007", ["2008"])[0]
    em, f1 = short_answer_scores("Paris France", ["Paris"])
    assert not em and f1 == pytest.approx(2 / 3)


@pytest.mark.parametrize("answer, aliases, grade", [
    ("Paris", ["Paris"], CORRECT),
    ("The answer is Paris.", ["Paris"], CORRECT),
    ("I think it is probably Paris, though I am not certain.", ["Paris"], CORRECT),  # hedged but committed
    ("Svaret är Grawiam Joraex.", ["Grawiam Joraex"], CORRECT),
    ("Joraex", ["Grawiam Joraex", "Joraex"], CORRECT),  # an alias
    ("It was founded in 1997.", ["1997"], CORRECT),
    ("It was founded in 1997 or 1998.", ["1997"], INCORRECT),  # a second number contradicts the gold
    ("Either Paris or Lyon.", ["Paris"], INCORRECT),  # alternatives without commitment
    ("London", ["Paris"], INCORRECT),
    ("Spain Tunisia Pakistan Bosnia Turkey Mauritania Egypt Georgia Senegal Gabon Czechia Kuwait Lithuania Chad "
     "Peru Mali Niger Oman Iran Iraq Laos Cuba Fiji Togo Benin Qatar Yemen Nepal Malta Japan Kenya", ["Spain"],
     INCORRECT),  # a list of candidates is no committed answer
    ("I'm not sure, but I would guess London.", ["Paris"], INCORRECT),  # a hedged wrong answer
    ("I don't know.", ["Paris"], NOT_ATTEMPTED),
    ("I searched but found no reliable source that mentions it.", ["Paris"], NOT_ATTEMPTED),
    ("Jag vet inte.", ["Paris"], NOT_ATTEMPTED),
    ("わかりません。", ["Paris"], NOT_ATTEMPTED),
    ("", ["Paris"], NOT_ATTEMPTED),
])
def test_simpleqa_rule_grades(answer, aliases, grade):
    assert RULE.simpleqa("q?", answer, aliases) == grade


def test_frames_rule_judgement():
    assert RULE.frames("q?", "It is Paris.", ["Paris"]) == TRUE
    assert RULE.frames("q?", "I don't know.", ["Paris"]) == FALSE
    assert RULE.frames("q?", "Lyon", ["Paris"]) == FALSE


def test_abstention_phrases():
    assert is_abstention("  ") and is_abstention("I could not find any information.")
    assert not is_abstention("Paris") and not is_abstention("The answer is Grawiam Joraex.")


def test_simpleqa_f_score_is_the_harmonic_mean():
    grades = [CORRECT] * 3 + [INCORRECT] + [NOT_ATTEMPTED] * 4
    s = simpleqa_f_score(grades)
    overall, attempted = 3 / 8, 3 / 4
    assert s["correct"] == overall and s["correct_given_attempted"] == attempted and s["not_attempted"] == 0.5
    assert s["f_score"] == pytest.approx(2 * overall * attempted / (overall + attempted))
    assert simpleqa_f_score([NOT_ATTEMPTED])["f_score"] == 0.0
    with pytest.raises(ValueError, match="unknown grade"):
        simpleqa_f_score(["MAYBE"])


def test_llm_grader_parses_the_judge_and_rejects_bad_replies():
    seen = []

    def client(messages):
        seen.append(messages)
        return 'Sure: {"grade": "NOT_ATTEMPTED"}'

    assert LLMGrader(client).simpleqa("Who?", "No idea.", ["Ada", "Ada L."]) == NOT_ATTEMPTED
    assert "GOLD TARGET:\nAda | Ada L." in seen[0][1]["content"] and "NOT_ATTEMPTED" in seen[0][0]["content"]
    assert LLMGrader(lambda m: '{"correct": true}').frames("q", "a", ["a"]) == TRUE
    assert LLMGrader(lambda m: '```json\n{"correct": false}\n```').frames("q", "a", ["b"]) == FALSE
    with pytest.raises(ModelReplyError, match="grade in"):
        LLMGrader(lambda m: '{"grade": "RIGHT"}').simpleqa("q", "a", ["a"])
    with pytest.raises(ModelReplyError, match="boolean"):
        LLMGrader(lambda m: '{"correct": "yes"}').frames("q", "a", ["a"])
    with pytest.raises(ModelReplyError, match="no JSON"):
        LLMGrader(lambda m: "CORRECT").simpleqa("q", "a", ["a"])


def test_a_bare_hedge_is_not_an_attempt_but_a_hedged_answer_is():
    assert is_abstention("Not sure.") and is_abstention("I'm not sure!")
    assert not is_abstention("Not sure, maybe London.")
    assert RULE.simpleqa("q?", "Not sure.", ["Paris"]) == NOT_ATTEMPTED
