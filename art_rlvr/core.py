"""The types every layer shares: a record, messages, one verdict, an environment's answer.

A record `x` is opaque (only a scenario's own reward and environment read it); a reward, an
episode scorer and a trajectory's outcome all say the same thing, a `Score`; an environment
answers a turn with a `Reply`. Everything here is data: no ART, no torch, nothing to load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Record = Mapping[str, Any]
Message = dict[str, Any]  # an OpenAI chat message, as ART's `Trajectory.messages()` gives it
Messages = Sequence[Mapping[str, Any]]
Loss = Literal["cispo", "ppo"]  # the policy-gradient losses ART's backends train with


def correct_from(reward: float, metrics: Mapping[str, Any]) -> bool:
    """The one rule: the reward's own `correct` metric if it set one, else a full reward."""
    value = metrics.get("correct")
    return float(value) >= 1.0 if value is not None else reward >= 1.0


class Score(BaseModel):
    """What a reward says about one completion or episode: the number in [0, 1], why, and
    countable facts (`correct` among them when the reward decides it)."""

    model_config = ConfigDict(frozen=True)

    reward: float = Field(ge=0.0, le=1.0)
    feedback: str = ""
    metrics: dict[str, float] = Field(default_factory=dict)

    @property
    def correct(self) -> bool:
        return correct_from(self.reward, self.metrics)


class Reply(BaseModel):
    """An environment's answer to an assistant turn: messages to append (feedback, the
    opponent's move), whether the episode is over, per-turn counts (summed over the episode:
    `illegal_actions`, say) and a line for the trajectory's logs."""

    model_config = ConfigDict(frozen=True)

    messages: tuple[dict[str, Any], ...] = ()
    done: bool = False
    metrics: dict[str, float] = Field(default_factory=dict)
    log: str | None = None

    @classmethod
    def say(cls, text: str, **fields: Any) -> Reply:
        """One user message."""
        return cls(messages=({"role": "user", "content": text},), **fields)


__all__ = ["Loss", "Message", "Messages", "Record", "Reply", "Score", "correct_from"]
