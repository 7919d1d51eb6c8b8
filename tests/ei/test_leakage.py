"""The deterministic answer-leak check on a table of forms that leak and forms that do not."""

from __future__ import annotations

from fractions import Fraction

import pytest

from art_rlvr.scenarios.leakage import answer_forms, answer_value, leaked_answers, leaks, quotes


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("The answer is 12.", "12"),
        ("so it must be 12", 12),
        ("It is 1234 in total", "1234"),
        ("It is 1,234 in total", "1234"),
        ("It is 1 234 in total", "1234"),
        ("It is 1\\,234 in total", "1234"),
        ("It is 1{,}234 in total", "1234"),
        ("It is 1234 in total", "1,234"),
        ("one thousand two hundred thirty-four", "1234"),
        ("one thousand two hundred and thirty four", "1234"),
        ("It is Seventeen.", "17"),
        ("twenty-one", "21"),
        ("twelve hundred", "1200"),
        ("three million", "3000000"),
        ("zero", "0"),
        ("it comes out as 12.0", "12"),
        ("the result, 2.50, is", "2.5"),
        ("$\\frac{3}{4}$", "0.75"),
        ("\\dfrac{3}{4}", "3/4"),
        ("\\tfrac34 of it", "\\frac{3}{4}"),
        ("3/4", "\\frac{3}{4}"),
        ("0.75", "\\frac{3}{4}"),
        ("\\frac{34}{2}", "17"),
        ("write \\boxed{17}", "17"),
        ("-5 is it", "-5"),
        ("it is \u22125", "-5"),
        ("minus five", "-5"),
        ("negative 5", "-5"),
        ("5 below zero", "-5"),  # the sign is ignored on purpose: 5 tells the student enough
        ("-12 maybe", "12"),
        ("Paris is the capital", "Paris"),
        ("PARIS", "paris"),
        ("x^2 + 1", "x^2 + 1"),
    ],
)
def test_leaks(text: str, answer: object) -> None:
    assert leaks(text, answer), (text, answer)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("It is 123", "12"),
        ("In 2013 we had", "13"),
        ("1.12 and 12.5", "12"),
        ("12,345 people", "12345.5"),
        ("add 5 and 7", "12"),
        ("twenty one apples", "20"),
        ("one two three", "123"),
        ("someone is done", "1"),
        ("Parisian food", "Paris"),
        ("Add the tens first, then the ones.", "30"),
        ("\\frac{3}{5}", "3/4"),
        ("no numbers at all", "4"),
        ("anything", ""),
    ],
)
def test_does_not_leak(text: str, answer: object) -> None:
    assert not leaks(text, answer), (text, answer)


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        ("12", Fraction(12)),
        (" 1,234 ", Fraction(1234)),
        ("-3.50", Fraction(-7, 2)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("-\\dfrac{1}{2}", Fraction(-1, 2)),
        ("\\boxed{7}", Fraction(7)),
        ("3/4", Fraction(3, 4)),
        ("Paris", None),
        ("x+1", None),
        ("1/0", None),
    ],
)
def test_answer_value(answer: str, value: Fraction | None) -> None:
    assert answer_value(answer) == value


@pytest.mark.parametrize("answer", ["17", "1234", "-5", "3/4", "2.5", "1000000"])
def test_every_listed_form_is_caught(answer: str) -> None:
    forms = answer_forms(answer)
    assert len(forms) >= 2
    for form in forms:
        assert leaks(f"Hint: think about {form} here.", answer), form


def test_leaked_answers_keeps_order_and_drops_duplicates() -> None:
    assert leaked_answers("13 and seven", ["7", "13", "7", "8"]) == ["7", "13"]


HINT = "Add the tens first, then the units."


@pytest.mark.parametrize(
    ("text", "n", "quoted"),
    [
        ("85", 4, False),
        ("add the tens: 80, then 5", 4, False),  # three words in a row: fine
        ("ADD THE TENS FIRST, so 80", 4, True),  # case and punctuation ignored
        ("first, then the units give 85", 4, True),
        ("first add the tens", 4, False),
        ("first add the tens", 2, True),
        ("Add the tens first, then the units.", None, True),
        ("Add the tens first, then 5 units.", None, False),  # all of it, in order
        ("anything", 4, False),
    ],
)
def test_quotes(text: str, n: int | None, quoted: bool) -> None:
    assert quotes(text, HINT, n) is quoted


@pytest.mark.parametrize(
    ("source", "quoted"), [("carry", True), ("the one", True), ("carry two", False), ("", False)]
)
def test_a_source_shorter_than_n_words_is_quoted_only_whole(source: str, quoted: bool) -> None:
    assert quotes("remember to carry the one", source, 4) is quoted
