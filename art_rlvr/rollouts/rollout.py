"""`rollout(model, scenario) -> art.Trajectory`, on any ART backend, and groups of them.

A record runs one of two ways. A scenario with a `[rollout]` function runs the user's ART
rollout function (`art_rlvr.rollouts.functions`). Every other record runs as an episode through
the one loop (`art_rlvr.rollouts.loop.run_episode`): the scenario binds the record into an
`Episode` (no `[environment]`: the single-turn case, one request and one reply), and the
episode's reward judges it, or, for an episode without one, the scenario's `[reward]` scores the
last reply. Groups go through ART's `trajectory_group` and `gather_trajectory_groups`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

import art

from art_rlvr.core.outcome import attach_outcome, completion_text
from art_rlvr.core.text import prompt_hash
from art_rlvr.observe import tracing
from art_rlvr.rollouts.functions import (
    ROLLOUT_ERROR,
    RolloutContext,
    RolloutFunctionError,
    check_some_succeeded,
    function_rollout,
    rollout_failure,
    trainable,
)
from art_rlvr.rollouts.loop import run_episode
from art_rlvr.rollouts.sampling import SamplingConfig, rollout_seed
from art_rlvr.scenarios.scenario import Example


def about(
    example: Example, system_prompt: str, extra: Mapping[str, object] | None
) -> dict[str, object]:
    """The metadata every rollout carries: which record, split and scenario, under which prompt."""
    return {
        "scenario_id": example.id,
        "split": example.split,
        "task": example.scenario.name,
        "prompt_hash": prompt_hash(system_prompt),
        **(extra or {}),
    }


async def run_function(
    model: art.Model,
    example: Example,
    *,
    system_prompt: str | None,
    sampling: SamplingConfig,
    step: int | None,
    messages: list[dict[str, str]] | None,
    metadata: Mapping[str, object] | None,
    limiter: asyncio.Semaphore | None,
) -> art.Trajectory:
    """The record through the scenario's rollout function, given what it may receive."""
    scenario = example.scenario
    assert scenario.rollout_fn is not None
    if messages is not None:
        raise ValueError(
            f"scenario {scenario.name!r} runs a rollout function, which builds its own "
            "messages: explicit opening messages cannot be given"
        )
    s = system_prompt if system_prompt is not None else scenario.default_system_prompt
    context = RolloutContext(
        system_prompt=s, sampling=sampling, scenario_id=example.id, split=example.split,
        step=step,
    )  # fmt: skip
    meta = about(example, s, metadata)
    return await function_rollout(model, example, context, metadata=meta, limiter=limiter)


@tracing.op("art_rlvr.rollout", inputs=tracing.rollout_inputs, output=tracing.trajectory_output)
async def rollout(
    model: art.Model,
    example: Example,
    *,
    system_prompt: str | None = None,
    sampling: SamplingConfig = SamplingConfig(),
    step: int | None = None,
    messages: list[dict[str, str]] | None = None,
    metadata: Mapping[str, object] | None = None,
    limiter: asyncio.Semaphore | None = None,
) -> art.Trajectory:
    """One scored episode of `scenario` under `system_prompt` (or from explicit opening
    `messages`, e.g. expert iteration's hinted prompt; the scenario's reward still scores it).
    `limiter`, if given, is held while a request is open, not while anything else runs (for a
    rollout function, while it runs)."""
    if example.scenario.rollout_fn is not None:
        return await run_function(
            model, example, system_prompt=system_prompt, sampling=sampling, step=step,
            messages=messages, metadata=metadata, limiter=limiter,
        )  # fmt: skip
    episode = example.episode(system_prompt, messages)
    opening = episode.messages
    content = opening[0]["content"] if opening and opening[0]["role"] == "system" else ""
    s = content if isinstance(content, str) else ""
    trajectory = await run_episode(
        model,
        episode,
        sampling=sampling,
        step=step,
        metadata=about(example, s, metadata),
        limiter=limiter,
    )
    if episode.reward is not None or trajectory.metrics.get("env_error"):
        return trajectory  # judged by the episode's reward, or 0 for a failed environment
    score = await example.score(completion_text(trajectory))
    return attach_outcome(
        trajectory, reward=score.reward, feedback=score.feedback, metrics=score.metrics
    )


async def rollout_group(
    model: art.Model,
    example: Example,
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
        else sampling.model_copy(update={"seed": rollout_seed(seed, example.id, i)})
        for i in range(n)
    ]
    return await art.trajectory_group(
        [
            rollout(model, example, system_prompt=system_prompt, sampling=c, limiter=limiter)
            for c in configs
        ],
        metadata={"scenario_id": example.id},
        return_exceptions=False,
    )


async def gather_groups(
    model: art.Model,
    examples: Iterable[Example],
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
            for sc in examples
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
    "run_episode",
    "trainable",
]
