"""The one rollout loop: `run_episode(model, episode) -> art.Trajectory`, on any ART backend.

Every rollout runs here: a scenario's record (single-turn or an environment's episode), a
hinted expert-iteration attempt, a GEPA or evaluation rollout, a verifiers environment's harness.
An `Episode` (art_rlvr.core.types) is the record bound: the opening messages, the tools, `respond`
and `reward` over the messages so far. It talks only through `model.openai_client()` and
`model.get_inference_name()`, the way ART's own agent examples do: each turn sends
`trajectory.messages()` (ART's rendering of the history) and appends the sampled `Choice` itself
to `trajectory.messages_and_choices`, so every assistant turn keeps the token ids and logprobs
that training needs.

The loop: sample a turn; run its tool calls in order (art_rlvr.rollouts.tools: every failure is a
message to the model, never an exception); ask `respond`. It goes on while the turn called
tools or `respond` sent messages, unless it says done, and stops at `max_turns` sampled turns
(`turn_cap_hit` = 1: a model that never stops calling tools). Then `reward` judges the episode.
`respond` and `reward` run off the event loop under the episode's timeout; if either fails or
answers nonsense, the episode ends with reward 0, the reason in `logs` and the feedback, and
`env_error` (or `reward_error`) = 1 in its metrics, and the run goes on. Backend errors (HTTP,
no choices) raise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import art
from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel

from art_rlvr.core.outcome import art_message, art_tools, attach_outcome, turns
from art_rlvr.core.types import Episode, Reply, Score
from art_rlvr.observe import tracing
from art_rlvr.rollouts.sampling import SamplingConfig, rollout_seed
from art_rlvr.rollouts.tools import (
    CallbackError,
    Tool,
    ToolCallResult,
    as_tools,
    call_tool,
    guarded,
    tool_choice_param,
)
from art_rlvr.scenarios.rewards.base import RewardTypeError, as_score

LOG_CHARS = 4000


def failure(error: CallbackError) -> str:
    """A failed callback for the logs: the one-line reason, then the traceback if any."""
    same = error.timed_out or error.detail == str(error)
    return str(error) if same else f"{error}\n{error.detail}"


def env_reply(value: object) -> Reply:
    """What `respond` returned as a `Reply` (a str is one user message)."""
    if value is None:
        return Reply()
    if isinstance(value, str):
        return Reply.say(value)
    if isinstance(value, Reply):
        return value
    raise TypeError(f"an environment returns Reply, str or None, not {type(value).__name__}")


def turn_seed(seed: int | None, index: int) -> int | None:
    """Turn 0 uses the episode's seed itself (a one-turn episode samples what a single request
    with that seed would); later turns get seeds derived from it."""
    if seed is None or index == 0:
        return seed
    return rollout_seed(seed, "turn", index)


def tool_metrics(results: Iterable[ToolCallResult]) -> dict[str, float]:
    """Counts over tool calls: every failure is a `tool_error`; timeouts, invalid arguments
    and unknown names are also counted on their own."""
    results = list(results)
    status = Counter(r.status for r in results)
    return {
        "tool_calls": float(len(results)),
        "tool_errors": float(sum(not r.ok for r in results)),
        "tool_timeouts": float(status["timeout"]),
        "tool_invalid_arguments": float(status["invalid_arguments"]),
        "tool_unknown": float(status["unknown_tool"]),
        "tool_truncated": float(sum(r.truncated for r in results)),
    }


def toolbox_of(episode: Episode) -> dict[str, Tool]:
    """The episode's tools by name; a plain function runs under the episode's tool timeout."""
    return as_tools(episode.tools, timeout_s=episode.tool_timeout_s)


def episode_metrics(
    episode: Episode, counts: Counter[str], results: list[ToolCallResult], summed: Counter[str]
) -> dict[str, float]:
    """What an episode counts. A single-turn one has no turns or tools to count: its tokens
    and whether the reply was cut; a multi-turn one adds turns, the turn cap, tool counts,
    `env_error` when something answers it and the environment's own per-turn counts."""
    base = {
        "completion_tokens": float(counts["completion_tokens"]),
        "truncated": float(counts["truncated_turns"] > 0),
    }
    if episode.single_turn:
        return base
    return {
        **{k: float(counts[k]) for k in ("turns", "turn_cap_hit", "truncated_turns")},
        **tool_metrics(results),
        **base,
        **({"env_error": float(counts["env_error"])} if episode.respond is not None else {}),
        **{k: float(v) for k, v in summed.items()},
    }


def _episode_inputs(inputs: Mapping[str, object]) -> dict[str, object]:
    episode = inputs.get("episode")
    sampling = inputs.get("sampling")
    return {
        "model": getattr(inputs.get("model"), "name", None),
        "step": inputs.get("step"),
        "messages": list(getattr(episode, "messages", ())),
        "tools": [
            getattr(t, "name", getattr(t, "__name__", "?")) for t in getattr(episode, "tools", ())
        ],
        "max_turns": getattr(episode, "max_turns", None),
        "sampling": sampling.model_dump() if isinstance(sampling, BaseModel) else sampling,
        "metadata": inputs.get("metadata"),
    }


def _episode_output(trajectory: art.Trajectory) -> dict[str, object]:
    return {"reward": trajectory.reward, "metrics": trajectory.metrics, "logs": trajectory.logs}


def _turn_inputs(inputs: Mapping[str, object]) -> dict[str, object]:
    trajectory = inputs["trajectory"]
    assert isinstance(trajectory, art.Trajectory)
    return {"index": inputs.get("index"), "messages": trajectory.messages()}


def _turn_output(sampled: tuple[Choice, int]) -> dict[str, object]:
    choice, tokens = sampled
    return {**choice.message.model_dump(exclude_none=True), "completion_tokens": tokens}


@tracing.op("art_rlvr.turn", inputs=_turn_inputs, output=_turn_output)
async def sample_turn(
    model: art.Model,
    trajectory: art.Trajectory,
    *,
    index: int,
    tool_choice: str | dict[str, object] | None,
    sampling: SamplingConfig,
    step: int | None,
    limiter: asyncio.Semaphore | None,
) -> tuple[Choice, int]:
    """One request with the history so far (ART's `trajectory.messages()`) and the tools on
    the trajectory: the sampled `Choice` and its completion tokens."""
    seed = turn_seed(sampling.seed, index)
    optional: dict[str, Any] = {  # keyword arguments for the SDK, sent only when set
        **({"tools": trajectory.tools} if trajectory.tools else {}),
        **({"tool_choice": tool_choice} if tool_choice is not None else {}),
        **({"seed": seed} if seed is not None else {}),
    }
    async with limiter if limiter is not None else contextlib.nullcontext():
        response = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(step),
            messages=trajectory.messages(),
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            stop=list(sampling.stop) or None,
            top_p=sampling.top_p,
            logprobs=True,
            **optional,
        )
    if not response.choices:
        raise RuntimeError(f"backend returned no choices at turn {index} of an episode")
    return response.choices[0], response.usage.completion_tokens if response.usage else 0


async def call_back(episode: Episode, what: str, messages: list[dict[str, object]]) -> object:
    """`respond` or `reward` on the episode so far, off the event loop under the episode's
    timeout; raises `CallbackError` saying what failed and why."""
    fn = episode.respond if what == "environment" else episode.reward
    assert fn is not None
    return await guarded(
        fn, (messages,), timeout_s=episode.timeout_s, what=what, detail_chars=LOG_CHARS
    )


@tracing.op("art_rlvr.env", inputs=tracing.env_inputs, output=tracing.env_output)
async def ask_env(episode: Episode, messages: list[dict[str, object]], index: int) -> Reply:
    """`respond`'s answer to turn `index`; raises `CallbackError` if it fails or answers
    nonsense."""
    try:
        return env_reply(await call_back(episode, "environment", messages))
    except TypeError as error:
        raise CallbackError(str(error)) from None


async def judge(episode: Episode, messages: list[dict[str, object]]) -> Score:
    """`reward`'s verdict as a `Score` (a number in [0, 1] or a bool, as a reward may return);
    raises `CallbackError` if it fails or returns anything else."""
    try:
        return as_score(await call_back(episode, "reward", messages))
    except RewardTypeError as error:
        raise CallbackError(f"reward {error}") from None


def zero(trajectory: art.Trajectory, what: str, error: CallbackError) -> None:
    """Reward 0 for an episode whose environment or reward failed, saying why."""
    attach_outcome(
        trajectory,
        reward=0.0,
        feedback=f"{what} failed, reward 0: {str(error).splitlines()[0]}",
        metrics={"correct": 0.0},
    )


@tracing.op("art_rlvr.episode", inputs=_episode_inputs, output=_episode_output)
async def run_episode(
    model: art.Model,
    episode: Episode,
    *,
    sampling: SamplingConfig = SamplingConfig(),
    step: int | None = None,
    metadata: Mapping[str, object] | None = None,
    limiter: asyncio.Semaphore | None = None,
) -> art.Trajectory:
    """One episode as a single `art.Trajectory` holding every sampled `Choice`, judged by the
    episode's `reward` if it has one (otherwise reward 0 for the caller to set, unless the
    environment failed: then it is 0 with the reason).

    Tool schemas go with every request and onto `Trajectory.tools`. `tool_choice` applies until
    the model has called a tool, then falls back to the server's default, as the OpenAI Agents
    SDK's `reset_tool_choice` does: a forced call on every turn would never let the model
    answer. `sampling.seed` seeds turn 0; later turns get seeds derived from it. `limiter`, if
    given, is held while a request is open."""
    if episode.max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {episode.max_turns}")
    toolbox = toolbox_of(episode)
    schemas = [t.definition for t in toolbox.values()]
    trajectory = art.Trajectory(
        messages_and_choices=[art_message(m) for m in episode.messages],
        tools=art_tools(schemas) if schemas else None,
        metadata=dict(metadata or {}),
    )
    wanted = sampling.tool_choice or episode.tool_choice  # the sampling's wins (EI's search)
    choice_param = tool_choice_param(wanted) if schemas else None
    results: list[ToolCallResult] = []
    counts: Counter[str] = Counter()  # turns, tokens and flags
    summed: Counter[str] = Counter()  # the environment's per-turn counts
    failed: CallbackError | None = None
    for index in range(episode.max_turns):
        choice, tokens = await sample_turn(
            model, trajectory, index=index, tool_choice=choice_param, sampling=sampling,
            step=step, limiter=limiter,
        )  # fmt: skip
        counts.update(
            turns=1, completion_tokens=tokens, truncated_turns=choice.finish_reason == "length"
        )
        trajectory.messages_and_choices.append(choice)
        calls = choice.message.tool_calls or []
        turn_results = [await call_tool(toolbox, call) for call in calls]
        trajectory.messages_and_choices.extend(art_message(r.message) for r in turn_results)
        trajectory.logs.extend(
            f"turn {index}: tool {r.name} ({r.tool_call_id}) {r.status}: {r.error}"
            for r in turn_results
            if r.error
        )
        results.extend(turn_results)
        if calls and episode.reset_tool_choice:
            choice_param = None
        reply = Reply()
        if episode.respond is not None:
            try:
                reply = await ask_env(episode, turns(trajectory), index)
            except CallbackError as error:
                counts["env_error"] = 1
                failed = error
                trajectory.logs.append(f"turn {index}: episode ended: {failure(error)}")
                break
            trajectory.messages_and_choices.extend(art_message(m) for m in reply.messages)
            summed.update(reply.metrics)
            if reply.log:
                trajectory.logs.append(f"turn {index}: {reply.log}")
        if reply.done or not (calls or reply.messages):
            break
    else:
        counts["turn_cap_hit"] = 1
        trajectory.logs.append(f"turn cap: the episode wanted more than {episode.max_turns} turns")
    trajectory.metrics.update(episode_metrics(episode, counts, results, summed))
    if failed is not None:
        zero(trajectory, "the environment", failed)
    elif episode.reward is not None:
        try:
            verdict = await judge(episode, turns(trajectory))
        except CallbackError as error:
            trajectory.metrics["reward_error"] = 1.0
            trajectory.logs.append(f"scoring failed, reward 0: {failure(error)}")
            zero(trajectory, "the reward", error)
        else:
            attach_outcome(
                trajectory,
                reward=verdict.reward,
                feedback=verdict.feedback,
                metrics={"reward_error": 0.0, **verdict.metrics},
            )
    return trajectory


__all__ = [
    "Episode",
    "Reply",
    "Score",
    "ask_env",
    "episode_metrics",
    "failure",
    "judge",
    "run_episode",
    "sample_turn",
    "tool_metrics",
    "turn_seed",
]
