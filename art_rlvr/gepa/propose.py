"""The proposer's side of an iteration (gepa's `proposer/`): ask the reflection LM, replay its
journaled replies on resume, and re-ask until a reply passes the proposal check.

`Run` is what an iteration works with (config, adapter, store, reflection, data); it is built
once per run by the optimizer and passed explicitly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from art_rlvr.gepa.adapter import ARTPromptAdapter
from art_rlvr.gepa.config import GEPAConfig
from art_rlvr.gepa.data import Candidate, GEPAState, HistoryEvent, Rejection
from art_rlvr.gepa.reflection import check_proposal, normalize
from art_rlvr.gepa.store import EvalStore
from art_rlvr.llm.client import ErrorKind, LLMClient, LLMCounters, LLMError, LLMReply
from art_rlvr.rundir.journal import Journal
from art_rlvr.scenarios.scenario import Example

log = logging.getLogger(__name__)


def unique(examples: Sequence[Example]) -> list[Example]:
    return list({example.id: example for example in examples}.values())


def known_prompts(
    rejections: Sequence[Rejection], candidates: Sequence[Candidate]
) -> dict[str, str]:
    """Normalised prompt -> why it must not be proposed again (shown to the reflection LM)."""
    known = {normalize(r.prompt): f"rejected: {r.reason}" for r in rejections}
    return known | {normalize(c.prompt): f"already candidate #{c.index}" for c in candidates}


def stop(state: GEPAState, reason: str) -> GEPAState:
    log.info("GEPA stops: %s", reason)
    return state.model_copy(update={"stop_reason": reason})


class ReflectionFailure(BaseModel):
    """A non-fatal reflection error as the journal keeps it, to be raised again on resume."""

    model_config = ConfigDict(frozen=True)

    message: str
    kind: ErrorKind
    status: int | None = None


class JournaledReply(BaseModel):
    """A journal's `reflection` record: the reply (or the non-fatal error) asked under `key`,
    and the client's counters right after it."""

    model_config = ConfigDict(frozen=True)

    key: str
    reply: LLMReply | None = None
    error: ReflectionFailure | None = None
    counters: dict[str, object] = Field(default_factory=dict)


def journaled_reply(record: dict[str, object]) -> JournaledReply | None:
    """A `reflection` record (None: another type of record, an evaluation)."""
    return JournaledReply.model_validate(record) if record.get("type") == "reflection" else None


def journaled_replies(journal: Journal) -> tuple[dict[str, JournaledReply], LLMCounters]:
    """The reflection replies of a journal by key, and the client's counters as of the last."""
    asked = [r for r in journal.read(journaled_reply) if r is not None]
    replies = {r.key: r for r in asked}
    return replies, LLMCounters.restore(asked[-1].counters) if asked else LLMCounters()


@dataclass
class ReflectionCalls:
    """The reflection LM's replies (and non-fatal errors), journaled as they come and replayed
    by key on resume, so a killed run asks nothing twice."""

    client: LLMClient
    journal: Journal
    replies: dict[str, JournaledReply]

    async def ask(self, key: str, messages: list[dict[str, str]]) -> LLMReply:
        done = self.replies.get(key)
        if done is not None and done.error is not None:
            e = done.error
            raise LLMError(e.message, kind=e.kind, status=e.status)
        if done is not None and done.reply is not None:
            return done.reply
        try:
            reply = await self.client.acomplete(messages)
        except LLMError as error:
            if not error.fatal:
                failure = ReflectionFailure(
                    message=str(error), kind=error.kind, status=error.status
                )
                self._record(key, failure)
            raise
        self._record(key, reply)
        return reply

    def _record(self, key: str, outcome: LLMReply | ReflectionFailure) -> None:
        counters = self.client.counters.snapshot()
        if isinstance(outcome, LLMReply):
            field, entry = "reply", JournaledReply(key=key, reply=outcome, counters=counters)
        else:
            field, entry = "error", JournaledReply(key=key, error=outcome, counters=counters)
        self.replies[key] = entry
        self.journal.append(
            {
                "type": "reflection",
                "key": key,
                field: outcome.model_dump(mode="json"),
                "counters": counters,
            }
        )


class IterationFacts(TypedDict):
    """What every history event of one iteration repeats (`HistoryEvent`'s fields)."""

    iteration: int
    parents: tuple[int, ...]
    minibatch: tuple[str, ...]
    score_before: float
    parent_scores: NotRequired[tuple[float, ...]]


@dataclass
class Run:
    config: GEPAConfig
    adapter: ARTPromptAdapter
    store: EvalStore
    reflection: ReflectionCalls
    pareto: list[Example]
    feedback: list[Example]

    def cost(self, prompt: str | None, examples: Sequence[Example]) -> int:
        """Metric calls to evaluate `prompt` on `examples` (None: a new prompt, nothing cached)."""
        todo = unique(examples) if prompt is None else self.store.missing(prompt, examples)
        return self.config.evaluation_cost(len(todo))

    def event(self, **fields: object) -> HistoryEvent:
        """A history event of `HistoryEvent`'s fields, stamped with the calls spent so far."""
        return HistoryEvent.model_validate({**fields, "metric_calls": self.store.spent})


async def propose(
    run: Run,
    state: GEPAState,
    *,
    key: str,
    kind: str,
    build: Callable[[Sequence[Rejection]], list[dict[str, str]]],
    parent_prompts: Sequence[str],
    answers: Sequence[str],
    base: IterationFacts,
) -> tuple[GEPAState, str | None]:
    """Ask until a reply passes `check_proposal` (or attempts run out); every refused reply is
    a history event with its rejection kind, and a refused prompt is remembered and shown on
    the next ask."""
    cfg = run.config
    history, rejections = list(state.history), list(state.rejections)
    counts = dict(state.counts)

    def settled(error_streak: int) -> GEPAState:
        return state.model_copy(
            update={
                "history": tuple(history),
                "rejections": tuple(rejections),
                "counts": counts,
                "error_streak": error_streak,
            }
        )

    for attempt in range(1, cfg.max_reflection_attempts + 1):
        shown = rejections[-cfg.max_shown_rejections :] if cfg.max_shown_rejections else []
        try:
            reply = await run.reflection.ask(f"{key}:{attempt}", build(shown))
        except LLMError as error:
            if error.fatal:
                raise
            streak = state.error_streak + 1
            log.error("iteration %d: reflection failed (%s); moving on", base["iteration"], error)
            history.append(
                run.event(kind="reflection_error", attempt=attempt, reason=str(error), **base)
            )
            counts["reflection_errors"] = counts.get("reflection_errors", 0) + 1
            state = settled(error_streak=streak)
            if streak >= cfg.max_consecutive_errors:
                state = stop(state, f"reflection failed {streak} times in a row; last: {error}")
            return state, None
        known = known_prompts(rejections, state.candidates)
        verdict = check_proposal(
            reply.text,
            reply.finish_reason,
            parents=parent_prompts,
            known=known,
            answers=answers,
            max_chars=cfg.max_prompt_chars,
        )
        if verdict.rejection is None:
            return settled(error_streak=0), verdict.prompt
        reason = verdict.reason or verdict.rejection.value
        log.info(
            "iteration %d attempt %d: proposal refused: %s", base["iteration"], attempt, reason
        )
        history.append(
            run.event(
                kind=kind,
                attempt=attempt,
                prompt=verdict.prompt,
                reason=reason,
                rejection=verdict.rejection,
                finish_reason=reply.finish_reason,
                **base,
            )
        )
        counts["refused_proposals"] = counts.get("refused_proposals", 0) + 1
        if verdict.prompt and normalize(verdict.prompt) not in known:
            rejections.append(
                Rejection(iteration=base["iteration"], prompt=verdict.prompt, reason=reason)
            )
    return settled(error_streak=0), None
