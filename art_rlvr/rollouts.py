"""`rollout(model, scenario) -> art.Trajectory`, on any ART backend.

It talks only through `model.openai_client()` and `model.get_inference_name()`, keeps the
response `Choice` (with the backend's token ids and logprobs) so the trajectory can be trained
on, and attaches the scenario's reward, metrics, feedback and metadata.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Iterable
from typing import Any

import art
from pydantic import BaseModel, ConfigDict, Field

from art_rlvr.observe import tracing
from art_rlvr.outcome import attach_outcome
from art_rlvr.scenario import Scenario
from art_rlvr.text import prompt_hash


class SamplingConfig(BaseModel):
    """How a rollout samples; `seed` makes a rollout's sample reproducible on TorchBackend."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(default=48, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: tuple[str, ...] = ()
    seed: int | None = None


def rollout_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts (run seed, step, scenario id, sample index)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


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
    """One scored sample of `scenario` under `system_prompt` (or under explicit `messages`,
    e.g. expert iteration's hinted prompt; the scenario's reward still scores it). `limiter`,
    if given, is held while the request is open, not while the reward scores it."""
    messages = messages if messages is not None else scenario.messages(system_prompt)
    s = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    extra = {"seed": sampling.seed} if sampling.seed is not None else {}
    async with limiter if limiter is not None else contextlib.nullcontext():
        response = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(step),
            messages=messages,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            stop=list(sampling.stop) or None,
            logprobs=True,
            **extra,
        )
    if not response.choices:
        raise RuntimeError(f"backend returned no choices for scenario {scenario.id}")
    choice = response.choices[0]
    text = choice.message.content or ""
    score = await scenario.score(text)
    usage = response.usage
    trajectory = art.Trajectory(
        messages_and_choices=[*messages, choice],
        metrics={
            "completion_tokens": float(usage.completion_tokens if usage else 0),
            "truncated": float(choice.finish_reason == "length"),
        },
        metadata={
            "scenario_id": scenario.id,
            "split": scenario.split,
            "task": scenario.task.name,
            "prompt_hash": prompt_hash(s),
            **(metadata or {}),
        },
    )
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
