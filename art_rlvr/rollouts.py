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
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import art

from art_rlvr.core import Score
from art_rlvr.episodes import Turn, failure, run_episode
from art_rlvr.observe import tracing
from art_rlvr.outcome import attach_outcome, completion_text, turns
from art_rlvr.rewards.base import RewardTypeError, as_score
from art_rlvr.sampling import SamplingConfig, rollout_seed
from art_rlvr.scenario import Episode, Scenario
from art_rlvr.text import prompt_hash
from art_rlvr.tools import CallbackError, guarded, tool


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
    `limiter`, if given, is held while a request is open, not while anything else runs."""
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
    return await art.gather_trajectory_groups(
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


__all__ = ["SamplingConfig", "gather_groups", "rollout", "rollout_group", "rollout_seed"]
