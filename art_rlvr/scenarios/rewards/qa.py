"""Short-answer QA: exact match and token F1 after SQuAD normalisation, best over gold answers.

The answer is read from the completion leniently but honestly: the text after the last explicit
"answer:" / "the answer is" marker if there is one, else the first non-empty line. Listing
several candidates on that line costs precision, so hedging never pays more than committing.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from art_rlvr.core.types import Record, Score
from art_rlvr.scenarios.rewards.base import RewardConfigError, first_error

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_MARKER = re.compile(r"\banswer\s*(?:is\s*:?|:)\s*", re.IGNORECASE)
_MAX_ANSWER_CHARS = 300


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalisation: lower case, drop punctuation and articles, squash spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def extract_answer(completion: str) -> str:
    """The short answer a reader would take from the completion ("" when there is none)."""
    text = completion[:20_000]
    markers = list(_MARKER.finditer(text))
    if markers:
        text = text[markers[-1].end() :]
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    return line.strip().strip("*_`\"' ").rstrip(".")[:_MAX_ANSWER_CHARS]


def gold_answers(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise ValueError(f"gold answers must be a string or a list of strings, got {value!r}")


class QAReward(BaseModel):
    """Reward = token F1 (or exact match) against the best-matching gold answer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    answers_field: str = "answers"
    reward_metric: Literal["f1", "em"] = "f1"
    reveal_answers_in_feedback: bool = False

    def __call__(self, x: Record, y: str) -> Score:
        golds = gold_answers(x[self.answers_field])
        y = y if isinstance(y, str) else ""
        predicted = extract_answer(y)
        em = max(exact_match(predicted, g) for g in golds)
        f1 = max(token_f1(predicted, g) for g in golds)
        reveal = f"; gold: {' | '.join(golds)}" if self.reveal_answers_in_feedback else ""
        if not normalize_answer(predicted):
            feedback = ("empty answer" if not y.strip() else "no answer found") + reveal
        elif em:
            feedback = f"exact match: {predicted!r}"
        elif f1:
            feedback = f"partial match (F1 {f1:.2f}): {predicted!r}{reveal}"
        else:
            feedback = f"wrong: {predicted!r} shares no words with the answer{reveal}"
        fmt = float(bool(predicted) and len(predicted.split()) <= 10)
        return Score(
            reward=f1 if self.reward_metric == "f1" else em,
            feedback=feedback,
            metrics={"correct": em, "em": em, "f1": f1, "format": fmt},
        )


def qa(**params) -> QAReward:
    try:
        return QAReward(**params)
    except ValidationError as error:
        raise RewardConfigError(f"bad parameters for reward 'qa': {first_error(error)}") from None
