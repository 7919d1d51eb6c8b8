"""A user's ART rollout function, run on one record and scored by the reward it set.

A scenario with a `[rollout]` function (`async def rollout(model, record[, context])`, loaded
and checked by `scenarios.environments.rollout_fn`) runs that function instead of the episode
loop: it builds its own messages and sets its own reward, inside ART's capture scope. Its reward is
ART's: any finite number (ART takes advantages within a group); without a `correct` metric, a
reward at or above the scenario's `correct_threshold` (1 by default) is correct. A function
that raises, hangs past its timeout, or returns anything but an `art.Trajectory` with a finite
reward set scores 0 with the reason in `logs`, `metadata["rollout_error"]` and `rollout_error`
= 1 in its metrics; a batch in which every rollout failed raises `RolloutsFailed` with the
first reason. A function that takes no context gets the run's system prompt, when there is one,
through its model's client (`art_rlvr.rollouts.prompted`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import traceback
from collections.abc import Iterable, Mapping, Sequence

import art
from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel, ConfigDict

from art_rlvr.core.outcome import attach_outcome, feedback_of, is_sampled
from art_rlvr.core.types import Record
from art_rlvr.rollouts.prompted import (
    PromptingClient,
    as_sent,
    prompted_model,
    sent_problem,
    sent_summary,
)
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.rundir.events import RolloutsFailed
from art_rlvr.scenarios.environments.rollout_fn import RolloutFailed, RolloutFunction
from art_rlvr.scenarios.scenario import Example

log = logging.getLogger(__name__)

ROLLOUT_ERROR = "rollout_error"  # the metric (1.0: failed) and the metadata key (the reason)


class RolloutContext(BaseModel):
    """What a rollout function with a third parameter receives beyond (model, record).

    `system_prompt`: the system message to send, verbatim (the scenario's, the run's
    `system_prompt=`, or GEPA's candidate: GEPA evolves exactly this string). `sampling`: the
    run's max_tokens, temperature, top_p and this sample's `seed`. `step`: the checkpoint the
    rollout samples from (None: the latest, `model.get_inference_name()`)."""

    model_config = ConfigDict(frozen=True)

    system_prompt: str
    sampling: SamplingConfig
    scenario_id: str
    split: str
    step: int | None = None

    @property
    def seed(self) -> int | None:
        return self.sampling.seed


class RolloutFunctionError(RuntimeError):
    """A rollout function failed on one record (raised by evaluation, which re-runs it on
    resume instead of booking a 0)."""


def returned_problem(value: object) -> str | None:
    """Why a rollout function's return value cannot be scored, or None."""
    if not isinstance(value, art.Trajectory):
        return f"returned {type(value).__name__}, not an art.Trajectory"
    if "reward" not in value.model_fields_set:
        return "returned a trajectory whose reward was never set (set trajectory.reward)"
    reward = value.reward
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        return f"returned reward {reward!r}, not a number"
    if not math.isfinite(reward):
        return f"returned a non-finite reward ({reward}); ART trains finite rewards only"
    return None


def with_capture(trajectory: art.Trajectory, scope: art.Trajectory) -> art.Trajectory:
    """The function's trajectory, given what ART's capture scope recorded when it kept
    neither messages nor exchanges of its own (a plain agent that only returns a reward)."""
    if trajectory.messages_and_choices or trajectory.exchanges or not scope.exchanges:
        return trajectory
    return trajectory.model_copy(update={"exchanges": scope.exchanges})


def served_tokens(trajectory: art.Trajectory) -> float:
    """Completion tokens the server reported for the captured exchanges."""
    return float(
        sum(
            e.response.usage.completion_tokens
            for e in trajectory.exchanges.chat_completions
            if e.response.usage is not None
        )
    )


def choice_tokens(choice: Choice) -> int | None:
    """A sampled turn's completion tokens: its served ids (ART's client asks for them), else
    the usage LangChain keeps (ART's LangGraph integration carries it onto the Choice)."""
    extra = choice.model_extra or {}
    if isinstance(extra.get("token_ids"), list):
        return len(extra["token_ids"])
    usage = extra.get("token_usage")
    return usage.get("completion_tokens") if isinstance(usage, dict) else None


def completion_tokens(trajectory: art.Trajectory) -> dict[str, float]:
    """`completion_tokens` for a function's trajectory, where it can be known and the function
    did not count them itself: the exchanges' usage, or every sampled turn's own count."""
    if "completion_tokens" in trajectory.metrics:
        return {}
    if trajectory.exchanges:
        return {"completion_tokens": served_tokens(trajectory)}
    counts = [choice_tokens(i) for i in trajectory.messages_and_choices if is_sampled(i)]
    if not counts or any(c is None for c in counts):
        return {}
    return {"completion_tokens": float(sum(c for c in counts if c is not None))}


def failed(trajectory: art.Trajectory, ref: str, reason: str) -> art.Trajectory:
    """Reward 0 for a rollout function that failed; what it sampled is kept."""
    log.warning("rollout function %s %s (reward 0)", ref, reason.splitlines()[0])
    trajectory.logs.append(f"rollout function {ref} {reason}")
    trajectory.metadata = {**trajectory.metadata, ROLLOUT_ERROR: reason.splitlines()[0]}
    return attach_outcome(
        trajectory,
        reward=0.0,
        feedback=f"rollout failed, reward 0: {reason.splitlines()[0]}",
        metrics={ROLLOUT_ERROR: 1.0, "correct": 0.0},
    )


def imposed_prompt(fn: RolloutFunction, context: RolloutContext) -> str | None:
    """The system prompt its requests must carry: the run's, for a function that takes no
    context (one that does sends `context.system_prompt` itself); None: as it wrote them."""
    return context.system_prompt if not fn.takes_context and context.system_prompt else None


async def call_function(
    fn: RolloutFunction, model: art.Model, record: Record, context: RolloutContext, timeout_s: float
) -> tuple[object, art.Trajectory, str | None]:
    """(what the function returned, ART's capture of its requests, why it failed or None); a
    function without a context sends the run's system prompt through its model's client."""
    prompt = imposed_prompt(fn, context)
    if prompt is None:
        return await call_plain(fn, model, record, context, timeout_s)
    client = PromptingClient(prompt)
    try:
        value, scope, problem = await call_plain(
            fn, prompted_model(model, client), record, context, timeout_s
        )
    finally:
        await client.aclose()
    if isinstance(value, art.Trajectory):
        value = as_sent(value, prompt)
        value.metadata = {**value.metadata, "system_prompt_sent": sent_summary(client)}
        problem = problem or sent_problem(value, scope, client)
    return value, scope, problem


async def call_plain(
    fn: RolloutFunction, model: art.Model, record: Record, context: RolloutContext, timeout_s: float
) -> tuple[object, art.Trajectory, str | None]:
    """The function called once, inside ART's capture scope and under `timeout_s`."""
    scope = art.Trajectory()
    args = (model, record, context) if fn.takes_context else (model, record)
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            with scope:
                value = await fn.fn(*args)
    except TimeoutError:
        if not deadline.expired():
            return None, scope, f"raised TimeoutError\n{traceback.format_exc()}"
        return None, scope, f"timed out after {timeout_s:g} s (the scenario's rollout timeout_s)"
    except RolloutFailed as error:  # a built-in function's failure, with what it sampled
        return error.trajectory, scope, error.reason
    except Exception as error:
        return None, scope, f"raised {type(error).__name__}: {error}\n{traceback.format_exc()}"
    return value, scope, returned_problem(value)


async def function_rollout(
    model: art.Model,
    example: Example,
    context: RolloutContext,
    *,
    metadata: Mapping[str, object],
    limiter: asyncio.Semaphore | None = None,
) -> art.Trajectory:
    """One record through the scenario's rollout function, scored by the reward it set."""
    scenario = example.scenario
    fn = scenario.rollout_fn
    assert fn is not None and scenario.spec.rollout is not None
    async with limiter if limiter is not None else contextlib.nullcontext():
        value, scope, problem = await call_function(
            fn, model, example.x, context, scenario.spec.rollout.timeout_s
        )
    base = value if isinstance(value, art.Trajectory) else scope
    trajectory = with_capture(base, scope)
    trajectory.metadata = {**trajectory.metadata, **metadata}
    if problem is not None:
        return failed(trajectory, fn.ref, problem)
    return attach_outcome(
        trajectory,
        reward=float(trajectory.reward),
        feedback=feedback_of(trajectory),
        metrics={ROLLOUT_ERROR: 0.0, **completion_tokens(trajectory)},
        correct_at=scenario.correct_at,
    )


def rollout_failure(trajectory: art.Trajectory) -> str | None:
    """Why a rollout function failed on this trajectory, or None."""
    if not trajectory.metrics.get(ROLLOUT_ERROR):
        return None
    return str(trajectory.metadata.get(ROLLOUT_ERROR, "the rollout function failed"))


def check_some_succeeded(trajectories: Sequence[art.Trajectory], what: str) -> None:
    """A batch where every rollout function failed is the run's failure, not a reward of 0."""
    reasons = [rollout_failure(t) for t in trajectories]
    if reasons and all(reasons):
        raise RolloutsFailed(f"all {len(reasons)} {what} rollouts failed; the first: {reasons[0]}")


def trainable(groups: Iterable[art.TrajectoryGroup]) -> list[art.TrajectoryGroup]:
    """The groups without trajectories that hold no sampled turn (a rollout function that
    failed before its first request): nothing of theirs can be trained."""
    out = []
    for group in groups:
        kept = [
            t
            for t in group.trajectories
            if not rollout_failure(t) or t.exchanges or any(map(is_sampled, t.messages_and_choices))
        ]
        out.append(
            group
            if len(kept) == len(group.trajectories)
            else art.TrajectoryGroup(kept, metadata=group.metadata)
        )
    return out


__all__ = [
    "ROLLOUT_ERROR",
    "RolloutContext",
    "RolloutFunctionError",
    "check_some_succeeded",
    "function_rollout",
    "rollout_failure",
    "trainable",
]
