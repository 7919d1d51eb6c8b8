"""The types every layer shares: a record, messages, one verdict, an environment's answer,
and an episode bound to its record.

A record `x` is opaque (only a scenario's own reward and environment read it); a reward, an
episode's reward and a trajectory's outcome all say the same thing, a `Score`; an environment
answers a turn with a `Reply`; an `Episode` is everything the one rollout loop
(`art_rlvr.rollouts.loop.run_episode`) needs to run one record. Everything here is data: no ART, no
torch, nothing to load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat

# a record's fields: only its scenario's reward and environment read them
Record = Mapping[str, object]
# an OpenAI chat message, as ART's `Trajectory.messages()` gives it; its values stay untyped while
# expert iteration's callers read them as `str`
Message = dict[str, Any]
Messages = Sequence[Mapping[str, object]]
Loss = Literal["cispo", "ppo"]  # the policy-gradient losses ART's backends train with
LrSchedule = Literal["constant", "linear", "cosine"]  # the learning rate over a run's RL steps


CORRECT_THRESHOLD = 1.0  # a reward at or above it is correct when nothing else decides


def correct_from(
    reward: float, metrics: Mapping[str, float], threshold: float = CORRECT_THRESHOLD
) -> bool:
    """The one rule: the reward's own `correct` metric if it set one, else a reward at or
    above `threshold` (a full reward of ours; a rollout function's scenario may declare
    another, since ART's rewards are any real number)."""
    value = metrics.get("correct")
    return float(value) >= 1.0 if value is not None else reward >= threshold


def correct_rule(threshold: float = CORRECT_THRESHOLD, where: str = "") -> str:
    """`correct_from`'s rule in words, as run files and reports state it."""
    declared = f" ({where})" if where else ""
    return f"the `correct` metric if set, else reward >= {threshold:g}{declared}"


class Outcome(BaseModel):
    """What a trajectory's reward said: any finite number (ART trains any real reward; a
    rollout function's may be -100 or 5), why, and countable facts."""

    model_config = ConfigDict(frozen=True)

    reward: FiniteFloat
    feedback: str = ""
    metrics: dict[str, float] = Field(default_factory=dict)

    @property
    def correct(self) -> bool:
        return correct_from(self.reward, self.metrics)


class Score(Outcome):
    """What one of our rewards, R(x, y), says about a completion or episode: the number in
    [0, 1] (our rewards' contract), why, and countable facts (`correct` among them when the
    reward decides it)."""

    reward: float = Field(ge=0.0, le=1.0)


class Reply(BaseModel):
    """An environment's answer to an assistant turn: messages to append (feedback, the
    opponent's move), whether the episode is over, per-turn counts (summed over the episode:
    `illegal_actions`, say) and a line for the trajectory's logs."""

    model_config = ConfigDict(frozen=True)

    messages: tuple[dict[str, object], ...] = ()
    done: bool = False
    metrics: dict[str, float] = Field(default_factory=dict)
    log: str | None = None

    @classmethod
    def say(
        cls,
        text: str,
        *,
        done: bool = False,
        metrics: Mapping[str, float] | None = None,
        log: str | None = None,
    ) -> Reply:
        """One user message."""
        return cls(
            messages=({"role": "user", "content": text},),
            done=done,
            metrics=dict(metrics or {}),
            log=log,
        )


DEFAULT_MAX_TURNS = 8
DEFAULT_CALLBACK_TIMEOUT_S = 30.0
DEFAULT_TOOL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Episode:
    """One record's episode with everything bound to the record, so the loop never reads `x`.

    `messages`: the opening. `tools`: functions (or `rollouts.tools.Tool`s) the model may call.
    `respond(episode so far)`: the answer to each turn, a `Reply`, a str (one user message) or
    None (nothing to add), sync or async; None: nothing answers. `reward(episode)`: R(x, episode)
    as a `Score`, a number in [0, 1] or a bool; None: the caller scores the last reply (a
    scenario's `[reward]`). Both run off the event loop under `timeout_s`. `max_turns` caps the
    sampled turns; `tool_choice` ("auto", "required", "none" or a tool's name) holds until the
    first tool call unless `reset_tool_choice` is False. A single-turn episode is one with no
    tools and nothing that answers or judges it: one request, one reply."""

    messages: Messages
    tools: tuple[object, ...] = ()  # functions or `rollouts.tools.Tool`s
    respond: Callable[[Messages], object] | None = None
    reward: Callable[[Messages], object] | None = None
    max_turns: int = DEFAULT_MAX_TURNS
    timeout_s: float = DEFAULT_CALLBACK_TIMEOUT_S
    tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S
    tool_choice: str | dict[str, object] | None = None
    reset_tool_choice: bool = True

    @property
    def single_turn(self) -> bool:
        return self.respond is None and self.reward is None and not self.tools


__all__ = [
    "CORRECT_THRESHOLD",
    "DEFAULT_CALLBACK_TIMEOUT_S",
    "DEFAULT_MAX_TURNS",
    "DEFAULT_TOOL_TIMEOUT_S",
    "Episode",
    "Loss",
    "LrSchedule",
    "Message",
    "Messages",
    "Outcome",
    "Record",
    "Reply",
    "Score",
    "correct_from",
    "correct_rule",
]
