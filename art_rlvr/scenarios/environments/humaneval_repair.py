"""`humaneval_repair`: write the function, run it against the task's tests in the sandbox, and
on a failure see the failing test's output and repair it, up to `rounds` replies.

Each reply is run by the `code` reward (scenarios.rewards.code: the sandbox contains hostile
code; a crash, a limit or a timeout is a failed round, never a failed run). The environment's
message after a failed round is that reward's one-line verdict (which test, what it raised),
cut to `feedback_chars`. Reward: `discount ** (rounds used - 1)` when the last reply passes,
else 0; metrics: `rounds`, `first_round_correct` (pass rate after one round) beside `correct`
(after up to `rounds`), and per episode `sandbox_timeouts` and `sandbox_errors` (crashes,
memory and output limits) summed over the rounds.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from art_rlvr.core.text import excerpt
from art_rlvr.core.types import Messages, Record, Reply, Score
from art_rlvr.scenarios.environments.base import Environment, assistant_texts
from art_rlvr.scenarios.rewards.code import CodeReward
from art_rlvr.scenarios.rewards.sandbox import sandbox_unavailable_reason


class HumanEvalRepair(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    rounds: int = Field(default=3, ge=1, le=20)
    discount: float = Field(default=1.0, gt=0.0, le=1.0)
    feedback_chars: int = Field(default=600, ge=80, le=20_000)
    code: CodeReward = CodeReward()

    async def respond(self, x: Record, episode: Messages) -> Reply:
        """Run the latest reply; done when it passes or no round is left, else the verdict
        and a request for the whole corrected function."""
        replies = assistant_texts(episode)
        used = len(replies)
        score = await self.code(x, replies[-1])
        metrics = {
            "sandbox_timeouts": score.metrics["timeout"],
            "sandbox_errors": score.metrics["sandbox_error"],
        }
        verdict = excerpt(score.feedback, self.feedback_chars)
        if score.correct:
            return Reply(done=True, metrics=metrics, log=f"round {used}: {verdict}")
        if used >= self.rounds:
            return Reply(done=True, metrics=metrics, log=f"round {used} (last): {verdict}")
        left = self.rounds - used
        return Reply.say(
            f"Your function failed the tests: {verdict}\n"
            f"Fix it and reply with the complete corrected function in one ```python code "
            f"block ({left} round{'s' if left > 1 else ''} left).",
            metrics=metrics,
            log=f"round {used}: {verdict}",
        )

    async def reward(self, x: Record, episode: Messages) -> Score:
        """The last reply, run once more: it passed or it did not."""
        replies = assistant_texts(episode)
        used = len(replies)
        final = await self.code(x, replies[-1] if replies else "")
        solved = final.correct
        kept = ("tests_passed", "tests_total", "pass_fraction", "format")
        return Score(
            reward=self.discount ** (used - 1) if solved else 0.0,
            feedback=(
                f"passed on round {used} of {self.rounds}"
                if solved
                else f"not passed in {used} round{'s' if used != 1 else ''}: {final.feedback}"
            ),
            metrics={
                **{k: final.metrics[k] for k in kept},
                "correct": float(solved),
                "first_round_correct": float(solved and used == 1),
                "rounds": float(used),
            },
        )


def environment(**params: Any) -> Environment:
    repair = HumanEvalRepair(**params)
    reason = sandbox_unavailable_reason(repair.code.sandbox)
    if reason is not None:
        raise ValueError(reason)
    return Environment(respond=repair.respond, reward=repair.reward, max_turns=repair.rounds)
