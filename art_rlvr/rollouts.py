"""`rollout(model, scenario) -> art.Trajectory`, on any ART backend.

Every scenario runs as an episode through `art_rlvr.episodes.run_episode` (one code path): a
scenario without an `[environment]` is the one-turn case (no tools, nothing answers the turn,
its `[reward]` scores the reply), so its request and its trajectory are what a single-reply
rollout has always sent and kept. It talks only through `model.openai_client()` and
`model.get_inference_name()`, keeps every sampled `Choice` (the backend's token ids and
logprobs) so the trajectory can be trained on, and ends in `attach_outcome`.

An environment's answers and its episode reward run off the event loop under the scenario's
timeout; if either fails, the episode ends with reward 0, the reason in `logs` and the
feedback, and `env_error` (or `reward_error`) = 1 in its metrics. The run goes on.

A scenario with a `[rollout]` function (a user's ART rollout, `async def rollout(model, record
[, context])`) runs that function instead (`function_rollout`): it builds its own messages and
sets its own reward, inside ART's capture scope. A function that raises, hangs past its
timeout, or returns anything but an `art.Trajectory` with a reward set in [0, 1] scores 0 with
the reason in `logs`, `metadata["rollout_error"]` and `rollout_error` = 1 in its metrics; a batch
in which every rollout failed raises `RolloutsFailed` with the first reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import art
from pydantic import BaseModel, ConfigDict

from art_rlvr.core import Score
from art_rlvr.environments.rollout_fn import RolloutFailed, RolloutFunction
from art_rlvr.episodes import Turn, failure, run_episode
from art_rlvr.observe import tracing
from art_rlvr.outcome import attach_outcome, completion_text, feedback_of, is_sampled, turns
from art_rlvr.records import RolloutsFailed
from art_rlvr.rewards.base import RewardTypeError, as_score
from art_rlvr.sampling import SamplingConfig, rollout_seed
from art_rlvr.scenario import Episode, Scenario
from art_rlvr.text import prompt_hash
from art_rlvr.tools import CallbackError, guarded, tool

log = logging.getLogger(__name__)

ROLLOUT_ERROR = "rollout_error"  # the metric (1.0: failed) and the metadata key (the reason)


def answerer(respond: Callable[[list[dict[str, Any]]], Any]) -> Callable[..., Any]:
    """The episode loop's environment callback for `respond(episode so far)`: sync stays sync
    (the loop runs it in a thread of its own), async stays async. Both speak `Reply`, so its
    answer passes as it is (anything else is for the loop to refuse, ending the episode)."""
    if inspect.iscoroutinefunction(respond):

        async def answer_async(turn: Turn, trajectory: art.Trajectory) -> Any:
            return await respond(turns(trajectory))

        return answer_async

    def answer(turn: Turn, trajectory: art.Trajectory) -> Any:
        return respond(turns(trajectory))

    return answer


def zero(trajectory: art.Trajectory, what: str) -> Score:
    """Reward 0 for an episode whose environment or reward failed; the reason is the last
    line of its logs."""
    reason = trajectory.logs[-1] if trajectory.logs else "unknown failure"
    first = reason.splitlines()[0] if reason else what
    return Score(reward=0.0, feedback=f"{what} failed, reward 0: {first}", metrics={"correct": 0})


async def episode_score(scenario: Scenario, episode: Episode, trajectory: art.Trajectory) -> Score:
    """R(x, trajectory): the scenario's reward on the one reply (as a single-reply rollout has
    always scored it), or the environment's reward over the episode, guarded."""
    if trajectory.metrics.get("env_error"):
        return zero(trajectory, "the environment")
    if episode.reward is None:
        return await scenario.score(completion_text(trajectory))
    try:
        value = await guarded(
            episode.reward, (turns(trajectory),), timeout_s=episode.timeout_s, what="reward"
        )
        try:
            value = as_score(value)  # a Score, a number in [0, 1] or a bool
        except RewardTypeError as error:
            message = f"reward {error}"
            raise CallbackError(message, timed_out=False, detail=message) from None
    except CallbackError as error:
        trajectory.logs.append(f"scoring failed, reward 0: {failure(error)}")
        trajectory.metrics["reward_error"] = 1.0
        return zero(trajectory, "the reward")
    trajectory.metrics["reward_error"] = 0.0
    return value


def one_turn_metrics(trajectory: art.Trajectory) -> dict[str, float]:
    """The metrics a single-reply rollout has always kept (and nothing else, so records and
    curves of single-turn runs stay as they were)."""
    return {
        "completion_tokens": trajectory.metrics["completion_tokens"],
        "truncated": float(trajectory.metrics["truncated_turns"] > 0),
    }


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


def returned_problem(value: Any) -> str | None:
    """Why a rollout function's return value cannot be scored, or None."""
    if not isinstance(value, art.Trajectory):
        return f"returned {type(value).__name__}, not an art.Trajectory"
    if "reward" not in value.model_fields_set:
        return "returned a trajectory whose reward was never set (set trajectory.reward)"
    reward = value.reward
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        return f"returned reward {reward!r}, not a number"
    if not math.isfinite(reward):
        return f"returned a non-finite reward ({reward})"
    if not 0.0 <= reward <= 1.0:
        return f"returned reward {reward}, outside [0, 1]"
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


def choice_tokens(choice: Any) -> int | None:
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


async def call_function(
    fn: RolloutFunction, model: art.Model, record: Any, context: RolloutContext, timeout_s: float
) -> tuple[Any, art.Trajectory, str | None]:
    """(what the function returned, ART's capture of its requests, why it failed or None)."""
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
    scenario: Scenario,
    context: RolloutContext,
    *,
    metadata: dict[str, Any],
    limiter: asyncio.Semaphore | None = None,
) -> art.Trajectory:
    """One record through the scenario's rollout function, scored by the reward it set."""
    task = scenario.task
    fn = task.rollout_fn
    assert fn is not None and task.spec.rollout is not None
    async with limiter if limiter is not None else contextlib.nullcontext():
        value, scope, problem = await call_function(
            fn, model, scenario.x, context, task.spec.rollout.timeout_s
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


@tracing.op("art_rlvr.rollout", inputs=tracing.rollout_inputs, output=tracing.trajectory_output)
async def rollout(
    model: art.Model,
    scenario: Scenario,
    *,
    system_prompt: str | None = None,
    sampling: SamplingConfig = SamplingConfig(),
    step: int | None = None,
    messages: list[dict[str, str]] | None = None,
    metadata: dict[str, Any] | None = None,
    limiter: asyncio.Semaphore | None = None,
) -> art.Trajectory:
    """One scored episode of `scenario` under `system_prompt` (or from explicit opening
    `messages`, e.g. expert iteration's hinted prompt; the scenario's reward still scores it).
    `limiter`, if given, is held while a request is open, not while anything else runs (for a
    rollout function, while it runs)."""
    if scenario.task.rollout_fn is not None:
        if messages is not None:
            raise ValueError(
                f"scenario {scenario.task.name!r} runs a rollout function, which builds its own "
                "messages: explicit opening messages cannot be given"
            )
        s = system_prompt if system_prompt is not None else scenario.task.default_system_prompt
        if not scenario.task.rollout_fn.takes_context and s != scenario.task.default_system_prompt:
            raise ValueError(
                f"rollout function {scenario.task.rollout_fn.ref!r} takes (model, record) only, "
                "so another system prompt cannot reach it: add a third parameter `context` and "
                "send `context.system_prompt`"
            )
        context = RolloutContext(
            system_prompt=s, sampling=sampling, scenario_id=scenario.id, split=scenario.split,
            step=step,
        )  # fmt: skip
        about = {
            "scenario_id": scenario.id, "split": scenario.split, "task": scenario.task.name,
            "prompt_hash": prompt_hash(s), **(metadata or {}),
        }  # fmt: skip
        return await function_rollout(model, scenario, context, metadata=about, limiter=limiter)
    episode = scenario.episode(system_prompt, messages)
    opening = episode.messages
    s = opening[0]["content"] if opening and opening[0]["role"] == "system" else ""
    trajectory = await run_episode(
        model,
        opening,
        tools=[tool(fn, timeout_s=episode.tool_timeout_s) for fn in episode.tools],
        tool_choice=sampling.tool_choice or episode.tool_choice,
        env=answerer(episode.respond) if episode.respond is not None else None,
        max_turns=episode.max_turns,
        sampling=sampling,
        step=step,
        callback_timeout_s=episode.timeout_s,
        metadata={
            "scenario_id": scenario.id,
            "split": scenario.split,
            "task": scenario.task.name,
            "prompt_hash": prompt_hash(s),
            **(metadata or {}),
        },
        limiter=limiter,
    )
    score = await episode_score(scenario, episode, trajectory)
    if episode.single_turn:
        trajectory.metrics = one_turn_metrics(trajectory)
    else:
        trajectory.metrics["truncated"] = float(trajectory.metrics["truncated_turns"] > 0)
    return attach_outcome(
        trajectory, reward=score.reward, feedback=score.feedback, metrics=score.metrics
    )


async def rollout_group(
    model: art.Model,
    scenario: Scenario,
    n: int,
    *,
    system_prompt: str | None = None,
    sampling: SamplingConfig = SamplingConfig(),
    seed: int | None = None,
    limiter: asyncio.Semaphore | None = None,
) -> art.TrajectoryGroup:
    """N rollouts of one scenario as ART's `TrajectoryGroup` (sample i gets its own seed);
    each holds a slot of `limiter`, if given, while its request is open."""
    configs = [
        sampling
        if seed is None
        else sampling.model_copy(update={"seed": rollout_seed(seed, scenario.id, i)})
        for i in range(n)
    ]
    return await art.trajectory_group(
        [
            rollout(model, scenario, system_prompt=system_prompt, sampling=c, limiter=limiter)
            for c in configs
        ],
        metadata={"scenario_id": scenario.id},
        return_exceptions=False,
    )


async def gather_groups(
    model: art.Model,
    scenarios: Iterable[Scenario],
    n: int,
    *,
    system_prompt: str | None = None,
    sampling: SamplingConfig = SamplingConfig(),
    seed: int | None = None,
    max_exceptions: int | float = 0,
    description: str = "rollouts",
    max_in_flight: int | None = None,
) -> list[art.TrajectoryGroup]:
    """Many groups at once through `art.gather_trajectory_groups` (its progress bar and limits).

    `max_in_flight` caps the requests open at once (a hosted endpoint's rate limit, a server's
    queue); None sends every rollout at once."""
    if max_in_flight is not None and max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1 or None, got {max_in_flight}")
    limiter = asyncio.Semaphore(max_in_flight) if max_in_flight is not None else None
    groups = await art.gather_trajectory_groups(
        (
            rollout_group(
                model,
                sc,
                n,
                system_prompt=system_prompt,
                sampling=sampling,
                seed=seed,
                limiter=limiter,
            )
            for sc in scenarios
        ),
        pbar_desc=description,
        max_exceptions=max_exceptions,
    )
    check_some_succeeded([t for g in groups for t in g.trajectories], description)
    return groups


__all__ = [
    "ROLLOUT_ERROR",
    "RolloutContext",
    "RolloutFunctionError",
    "SamplingConfig",
    "check_some_succeeded",
    "function_rollout",
    "gather_groups",
    "rollout",
    "rollout_failure",
    "rollout_group",
    "rollout_seed",
    "trainable",
]
