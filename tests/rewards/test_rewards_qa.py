"""The QA reward: SQuAD-normalised exact match and token F1, best over the gold answers."""

import pytest

from art_rlvr import load_scenario
from art_rlvr.scenarios.rewards.qa import QAReward, extract_answer, normalize_answer, token_f1

REWARD = QAReward()
PELL = ["Pell Harbor"]
CELLO = ["cello", "the cello", "cellist"]
YEARS = ["20", "twenty", "20 years"]
SHIP = ["HMS Resolute Dawn", "Resolute Dawn"]


@pytest.mark.parametrize(
    ("golds", "completion", "em", "f1"),
    [
        (PELL, "Pell Harbor", 1, 1),
        (PELL, "pell harbor.", 1, 1),
        (PELL, "The Pell Harbor", 1, 1),  # articles are dropped
        (PELL, "**Pell Harbor**", 1, 1),
        (PELL, "Answer: Pell Harbor", 1, 1),
        (PELL, "Lina Okoro designed it. So the answer is: Pell Harbor", 1, 1),
        (PELL, "Pell Harbor\nBecause the designer was born there.", 1, 1),  # first line
        (PELL, "The answer is Pell Harbor, a coastal town.", 0, 2 / 3),
        (PELL, "Pell", 0, 2 / 3),
        (PELL, "Pell Harbor or Delmere", 0, 2 / 3),  # hedging costs precision
        (PELL, "Delmere", 0, 0),
        (CELLO, "Cellist", 1, 1),  # best over several gold answers
        (CELLO, "She played the cello.", 0, 0.5),
        (YEARS, "20 years.", 1, 1),
        (YEARS, "Twenty", 1, 1),
        (SHIP, "HMS Resolute-Dawn", 0, 0.4),  # SQuAD drops punctuation without a space
        (PELL, "", 0, 0),
        (PELL, "   \n  ", 0, 0),
        (PELL, "\x00\x01\xff", 0, 0),
        (PELL, "🙂 ∑∫ soup", 0, 0),
        (PELL, "Pell Harbor " * 10_000, 0, 2 * (2 / 50) / (2 / 50 + 1)),  # capped at 300 chars
    ],
)
def test_qa_reward_table(golds: list[str], completion: str, em: int, f1: float) -> None:
    score = REWARD({"answers": golds}, completion)
    assert score.metrics["em"] == em and score.metrics["correct"] == em
    assert score.metrics["f1"] == pytest.approx(f1, abs=0.02)
    assert score.reward == pytest.approx(f1, abs=0.02)
    assert score.feedback


def test_exact_match_metric_and_string_gold() -> None:
    em_reward = QAReward(reward_metric="em")
    assert em_reward({"answers": "Pell Harbor"}, "Pell").reward == 0.0
    assert em_reward({"answers": "Pell Harbor"}, "the pell harbor").reward == 1.0


def test_gold_answers_only_in_feedback_when_configured() -> None:
    hidden = REWARD({"answers": PELL}, "Delmere").feedback
    shown = QAReward(reveal_answers_in_feedback=True)({"answers": PELL}, "Delmere").feedback
    assert "Pell" not in hidden and "shares no words" in hidden
    assert "gold: Pell Harbor" in shown


def test_feedback_kinds() -> None:
    assert REWARD({"answers": PELL}, "Pell Harbor").feedback.startswith("exact match")
    assert REWARD({"answers": PELL}, "Pell").feedback.startswith("partial match (F1 0.67)")
    assert REWARD({"answers": PELL}, "").feedback == "empty answer"
    assert REWARD({"answers": PELL}, "...").feedback == "no answer found"


def test_normalisation_and_f1_helpers() -> None:
    assert normalize_answer("  The  Quick, brown FOX! ") == "quick brown fox"
    assert token_f1("x y z", "x y") == pytest.approx(0.8)
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0
    assert extract_answer("Reasoning...\nFinal answer: 42 apples.") == "42 apples"


@pytest.mark.parametrize("bad", [None, 3, [], [1, 2]])
def test_malformed_gold_is_a_clear_error(bad: object) -> None:
    with pytest.raises(ValueError, match="gold answers must be"):
        REWARD({"answers": bad}, "x")


def test_non_string_completion_scores_zero() -> None:
    assert REWARD({"answers": PELL}, None).reward == 0.0  # type: ignore[arg-type]


async def test_shipped_qa_sample_is_answerable_from_its_context() -> None:
    task = load_scenario("qa", seed=0)
    scenarios = [sc for split in task.splits.values() for sc in split]
    assert len(scenarios) == 20 and len({sc.id for sc in scenarios}) == 20
    extractive = 0
    for sc in scenarios:
        context = normalize_answer(sc.x["context"])
        extractive += any(normalize_answer(a) in context for a in sc.x["answers"])
        assert sc.x["context"] in sc.messages()[-1]["content"]
        assert (await sc.score(sc.x["answers"][0])).reward == 1.0
        assert (await sc.score("I am not sure")).reward == 0.0
    assert extractive == 19  # one answer (a difference of two years) must be computed
