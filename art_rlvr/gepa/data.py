"""The data a GEPA run keeps: evaluations, candidates, rejections, history, the resumable state.

All frozen pydantic models, so a run's state is plain JSON: readable in the run folder, and
reloaded exactly on resume.
"""

from __future__ import annotations

import statistics
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

STATE_VERSION = 1


class RolloutTrace(BaseModel):
    """One scored rollout, as much of it as reflection needs: `output` is the last sampled
    turn's text, `episode` every message from the first sampled turn on (assistant turns, tool
    calls, tool results) as plain message dicts; empty in journals written before it existed."""

    model_config = ConfigDict(frozen=True)

    output: str
    reward: float
    correct: bool | None = None  # `outcome.is_correct`; None in journals written before it
    feedback: str = ""
    truncated: bool = False
    episode: tuple[dict[str, object], ...] = ()

    @property
    def solved(self) -> bool:
        """The one rule (`outcome.is_correct`); a full reward for journals without it."""
        return self.correct if self.correct is not None else self.reward >= 1.0


class ExampleEval(BaseModel):
    """A prompt's TrajectoryGroup on one scenario, reduced to text; its score is the mean
    reward of the group."""

    model_config = ConfigDict(frozen=True)

    scenario_id: str
    prompt_hash: str
    inputs: str
    rollouts: tuple[RolloutTrace, ...]

    @property
    def score(self) -> float:
        return statistics.fmean(r.reward for r in self.rollouts) if self.rollouts else 0.0

    @property
    def perfect(self) -> bool:
        return bool(self.rollouts) and all(r.solved for r in self.rollouts)


class Candidate(BaseModel):
    """A prompt in the pool, with its per-scenario scores on the Pareto set."""

    model_config = ConfigDict(frozen=True)

    index: int
    prompt: str
    parents: tuple[int, ...] = ()
    origin: Literal["seed", "carried", "reflection", "merge"] = "seed"
    iteration: int = -1
    pareto_scores: dict[str, float]
    metric_calls_at_discovery: int = 0

    @property
    def mean(self) -> float:
        return statistics.fmean(self.pareto_scores.values()) if self.pareto_scores else 0.0


class RejectionKind(StrEnum):
    """Why a proposal was turned down, decided where it is turned down (the proposal check,
    or the minibatch comparison) and counted by kind in the run's summary."""

    NO_FENCED_PROMPT = "no_fenced_prompt"  # no complete ``` block (none, or cut off)
    EMPTY = "empty"  # a complete block with nothing in it
    TOO_LONG = "too_long"
    LEAK = "leak"  # copies a shown example's gold answer
    UNCHANGED = "unchanged"  # the same as the instruction it should improve
    REPEAT = "repeat"  # already rejected, or already a candidate
    NO_IMPROVEMENT = "no_improvement"  # evaluated: did not beat its parent(s) on the minibatch


class Rejection(BaseModel):
    """A proposal that was turned down; shown to the reflection LM so it is not retried."""

    model_config = ConfigDict(frozen=True)

    iteration: int
    prompt: str
    reason: str


EventKind = Literal[
    "reflection",
    "merge",
    "perfect_minibatch",
    "reflection_error",
    "merge_skipped",
]


class HistoryEvent(BaseModel):
    """One line of the prompt history: a proposal (accepted or why not), or why none was made."""

    model_config = ConfigDict(frozen=True)

    iteration: int
    kind: EventKind
    attempt: int | None = None
    parents: tuple[int, ...] = ()
    minibatch: tuple[str, ...] = ()
    prompt: str | None = None
    score_before: float | None = None
    score_after: float | None = None
    parent_scores: tuple[float, ...] = ()
    accepted: bool = False
    reason: str = ""
    rejection: RejectionKind | None = None
    candidate: int | None = None
    pareto_mean: float | None = None
    evicted: int | None = None
    finish_reason: str | None = None
    metric_calls: int = 0


class GEPAState(BaseModel):
    """Everything decided so far, written at iteration boundaries. The sampler position and
    the selection RNG are functions of (seed, iteration), so `iteration` is their whole state."""

    model_config = ConfigDict(frozen=True)

    version: int = STATE_VERSION
    fingerprint: str
    iteration: int = 0
    candidates: tuple[Candidate, ...] = ()
    pool: tuple[int, ...] = ()
    rejections: tuple[Rejection, ...] = ()
    history: tuple[HistoryEvent, ...] = ()
    perfect_streak: int = 0
    error_streak: int = 0
    merges_due: int = 0
    merges_done: int = 0
    stop_reason: str | None = None
    counts: dict[str, int] = Field(default_factory=dict)

    def count(self, key: str, by: int = 1) -> dict[str, int]:
        return {**self.counts, key: self.counts.get(key, 0) + by}

    @property
    def best(self) -> Candidate:
        """Highest mean on the Pareto set; the earlier candidate wins a tie."""
        return max(self.candidates, key=lambda c: (c.mean, -c.index))
