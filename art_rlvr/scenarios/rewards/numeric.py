"""Numeric answers: a lenient-but-honest extractor and exact comparison.

Lenient: small models write "37 + 48 = 85" or "The answer is 85." and still deserve credit.
Honest: exactly one number is picked (an explicit answer marker, else the number after the
last '=', else the only number, else the last one), so listing several guesses never helps.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from pydantic import BaseModel, ConfigDict

from art_rlvr.core.types import Record, Score

_NUMBER = r"[-−]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|[-−]?\d+(?:\.\d+)?"
_MARKED = re.compile(
    rf"(?:answer(?:\s+is)?|result(?:\s+is)?|equals|is equal to|=)\s*:?\s*\**\s*\$?({_NUMBER})",
    re.IGNORECASE,
)
_ANY = re.compile(_NUMBER)
_MAX_CHARS = 20_000


def parse_number(text: str) -> Decimal | None:
    try:
        return Decimal(text.replace(",", "").replace("−", "-"))
    except InvalidOperation:
        return None


def extract_number(completion: str) -> str | None:
    """The single number a reader would take as the answer, or None."""
    text = completion[:_MAX_CHARS]
    marked = _MARKED.findall(text)
    if marked:
        return marked[-1]
    numbers = _ANY.findall(text)
    if not numbers:
        return None
    return numbers[0] if len(numbers) == 1 else numbers[-1]


def is_bare_number(completion: str) -> bool:
    """Strict format: the reply is a number and nothing else (and not absurdly long)."""
    return len(completion) <= 64 and re.fullmatch(rf"\s*({_NUMBER})\.?\s*", completion) is not None


class NumericReward(BaseModel):
    """Reward 1 when the extracted number equals `x[answer_field]`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    answer_field: str = "answer"
    reveal_answer_in_feedback: bool = True

    def __call__(self, x: Record, y: str) -> Score:
        gold = parse_number(str(x[self.answer_field]))
        if gold is None:
            raise ValueError(
                f"record field {self.answer_field!r} is not a number: {x[self.answer_field]!r}"
            )
        y = y if isinstance(y, str) else ""
        fmt = float(is_bare_number(y))
        picked = extract_number(y)
        if picked is None:
            note = "no number found in the answer" if y.strip() else "empty answer"
            return Score(
                reward=0.0, feedback=note, metrics={"correct": 0.0, "format": fmt, "parsed": 0.0}
            )
        value = parse_number(picked)
        correct = value is not None and value == gold
        expected = f", expected {gold}" if self.reveal_answer_in_feedback else ""
        feedback = (
            f"correct: {picked}"
            + ("" if fmt else " (but the reply had extra text besides the number)")
            if correct
            else f"wrong: the answer read as {picked}{expected}"
        )
        return Score(
            reward=1.0 if correct else 0.0,
            feedback=feedback,
            metrics={"correct": float(correct), "format": fmt, "parsed": 1.0},
        )


def numeric(**params) -> NumericReward:
    return NumericReward(**params)
