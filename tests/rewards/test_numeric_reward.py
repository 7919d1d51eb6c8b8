import pytest

from art_rlvr.scenarios.rewards.numeric import NumericReward, extract_number

REWARD = NumericReward()


@pytest.mark.parametrize(
    ("completion", "gold", "correct", "fmt"),
    [
        ("42", 42, 1, 1),
        ("42.", 42, 1, 1),
        (" 42 \n", 42, 1, 1),
        ("12 + 30 = 42", 42, 1, 0),
        ("The answer is 42.", 42, 1, 0),
        ("The answer is: **42**", 42, 1, 0),
        ("12 + 30 = 42. So the answer is 42", 42, 1, 0),
        ("12 + 30 = 32", 42, 0, 0),
        ("41 or 42 or 43", 42, 0, 0),  # several guesses: only the last counts
        ("To add 12 and 30 we", 42, 0, 0),
        ("1,234", 1234, 1, 1),
        ("−5", -5, 1, 1),
        ("-5", 5, 0, 1),
        ("42.0", 42, 1, 1),
        ("", 42, 0, 0),
        ("   ", 42, 0, 0),
        ("\x00\x01\xff binary", 42, 0, 0),
        ("ðŸ™‚ unicode soup ∑∫", 42, 0, 0),
        ("9" * 50_000, 42, 0, 0),
        ("answer = 7 = 42", 42, 1, 0),
    ],
)
def test_numeric_reward_table(completion: str, gold: int, correct: int, fmt: int) -> None:
    score = REWARD({"answer": gold}, completion)
    assert score.metrics["correct"] == correct
    assert score.reward == float(correct)
    assert score.metrics["format"] == fmt
    assert score.feedback


def test_feedback_names_expected_only_when_allowed() -> None:
    assert "expected 42" in REWARD({"answer": 42}, "41").feedback
    quiet = NumericReward(reveal_answer_in_feedback=False)
    assert "42" not in quiet({"answer": 42}, "41").feedback


def test_non_string_output_scores_zero() -> None:
    assert REWARD({"answer": 1}, None).reward == 0.0  # type: ignore[arg-type]


def test_extract_prefers_marker_over_last_number() -> None:
    assert extract_number("The answer is 5, not 6") == "5"


def test_bad_gold_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a number"):
        REWARD({"answer": "abc"}, "1")
