"""`arith_retry`: an arithmetic question with up to `attempts` tries; after a wrong one the
environment says so (without the answer) and asks again.

Reward: `discount ** (tries used - 1)` when solved, else 0, so a first-try answer is worth
most; `correct` means solved within the attempts at all. Each reply is read by the same
lenient-but-honest number extractor as the single-turn `arith` scenario.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from art_rlvr.core.types import Messages, Record, Reply, Score
from art_rlvr.scenarios.environments.base import Environment, assistant_texts
from art_rlvr.scenarios.rewards.numeric import NumericReward


class ArithRetry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    attempts: int = Field(default=3, ge=1, le=20)
    discount: float = Field(default=1.0, gt=0.0, le=1.0)
    answer_field: str = "answer"

    @property
    def check(self) -> NumericReward:
        return NumericReward(answer_field=self.answer_field, reveal_answer_in_feedback=False)

    def tries(self, x: Record, episode: Messages) -> list[Score]:
        """Each reply scored, up to the first right one."""
        scores: list[Score] = []
        for text in assistant_texts(episode):
            scores.append(self.check(x, text))
            if scores[-1].correct:
                break
        return scores

    def respond(self, x: Record, episode: Messages) -> Reply:
        scores = self.tries(x, episode)
        used, last = len(scores), scores[-1]
        if last.correct:
            return Reply(done=True, log=f"solved on try {used}")
        if used >= self.attempts:
            return Reply(done=True, log=f"not solved in {used} tries")
        left = self.attempts - used
        read = (
            "I could not find a number in your answer"
            if not last.metrics.get("parsed")
            else f"{last.feedback.removeprefix('wrong: the answer read as ')} is not right"
        )
        plural = "ies" if left > 1 else "y"
        return Reply.say(
            f"{read}. Try again ({left} tr{plural} left). Answer with just the number."
        )

    def reward(self, x: Record, episode: Messages) -> Score:
        scores = self.tries(x, episode)
        solved = bool(scores) and scores[-1].correct
        used = len(scores)
        reward = self.discount ** (used - 1) if solved else 0.0
        return Score(
            reward=reward,
            feedback=(
                f"solved on try {used} of {self.attempts}"
                if solved
                else f"not solved in {used} tries of {self.attempts}"
            ),
            metrics={
                "correct": float(solved),
                "first_try": float(solved and used == 1),
                "attempts": float(used),
                "format": scores[-1].metrics.get("format", 0.0) if scores else 0.0,
            },
        )


def environment(**params) -> Environment:
    game = ArithRetry(**params)
    return Environment(respond=game.respond, reward=game.reward, max_turns=game.attempts)
