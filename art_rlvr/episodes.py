"""`run_episode(model, messages, tools=..., env=...) -> art.Trajectory`: a multi-turn rollout
with tools, on any ART backend.

It talks only through `model.openai_client()` and `model.get_inference_name()`, the way ART's
own agent examples do: each turn sends `trajectory.messages()` (ART's rendering of the history)
and appends the sampled `Choice` itself to `trajectory.messages_and_choices`, so every assistant
turn keeps the token ids and logprobs that training needs. Tool calls are answered by `tool`
messages (see art_rlvr.tools: every failure is a message to the model, never an exception);
an optional environment callback answers each turn with next messages or done (a game's move,
a test's output); an optional scoring callback sets the reward, otherwise it is 0.0 for the
caller to set. Environment and scoring code runs off the event loop with a timeout; if it fails,
the episode ends with reward 0 and the reason in `logs` and `metrics`, and the run goes on.

The loop: sample a turn; run its tool calls in order; ask the environment. It goes on while the
turn called tools or the environment sent messages, unless the environment says done, and stops
at `max_turns` sampled turns (`turn_cap_hit` = 1: a model that never stops calling tools).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import art
from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel, ConfigDict, ValidationError

from art_rlvr.core import Reply, Score
from art_rlvr.observe import tracing
from art_rlvr.outcome import art_message, art_tools, attach_outcome
from art_rlvr.rewards.base import as_score
from art_rlvr.sampling import SamplingConfig, rollout_seed
from art_rlvr.tools import (
    CallbackError,
    Tool,
    ToolCallResult,
    ToolChoice,
    as_tools,
    call_tool,
    guarded,
    tool_choice_param,
)

DEFAULT_MAX_TURNS = 8
DEFAULT_CALLBACK_TIMEOUT_S = 30.0
LOG_CHARS = 4000


class Turn(BaseModel):
    """One sampled assistant turn and what its tool calls returned: what an environment sees."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    index: int
    choice: Choice
    tool_results: tuple[ToolCallResult, ...] = ()

    @property
    def text(self) -> str:
        return self.choice.message.content or ""


# An environment gets the turn and the trajectory so far; it returns a `Reply` (the one model of
# an environment's answer, shared with scenario environments), a str (one user message) or None
# (nothing to add), directly or as an awaitable.
Environment = Callable[[Turn, art.Trajectory], Reply | str | Awaitable[Any] | None]
Scorer = Callable[[art.Trajectory], Score | float | bool | Awaitable[Any]]


def failure(error: CallbackError) -> str:
    """A failed callback for the logs: the one-line reason, then the traceback if any."""
    same = error.timed_out or error.detail == str(error)
    return str(error) if same else f"{error}\n{error.detail}"


def env_reply(value: Any) -> Reply:
    """An environment's return value as a `Reply` (a str is one user message)."""
    if value is None:
        return Reply()
    if isinstance(value, str):
        return Reply.say(value)
    if isinstance(value, Reply):
        return value
    raise TypeError(f"an environment returns Reply, str or None, not {type(value).__name__}")


def turn_seed(seed: int | None, index: int) -> int | None:
    """Turn 0 uses the episode's seed itself (a one-turn episode samples what `rollout` would);
    later turns get seeds derived from it."""
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


def _episode_inputs(inputs: Mapping[str, Any]) -> dict[str, Any]:
    sampling = inputs.get("sampling")
    return {
        "model": getattr(inputs.get("model"), "name", None),
        "step": inputs.get("step"),
        "messages": inputs.get("messages"),
        "tools": [getattr(t, "name", getattr(t, "__name__", "?")) for t in inputs.get("tools", ())],
        "max_turns": inputs.get("max_turns"),
        "sampling": sampling.model_dump() if isinstance(sampling, BaseModel) else sampling,
        "metadata": inputs.get("metadata"),
    }


def _episode_output(trajectory: art.Trajectory) -> dict[str, Any]:
    return {"reward": trajectory.reward, "metrics": trajectory.metrics, "logs": trajectory.logs}


def _turn_inputs(inputs: Mapping[str, Any]) -> dict[str, Any]:
    trajectory = inputs["trajectory"]
    return {"index": inputs.get("index"), "messages": trajectory.messages()}


def _turn_output(sampled: tuple[Choice, int]) -> dict[str, Any]:
    choice, tokens = sampled
    return {**choice.message.model_dump(exclude_none=True), "completion_tokens": tokens}


@tracing.op("art_rlvr.turn", inputs=_turn_inputs, output=_turn_output)
async def sample_turn(
    model: art.Model,
    trajectory: art.Trajectory,
    *,
    index: int,
    tool_choice: str | dict[str, Any] | None,
    sampling: SamplingConfig,
    step: int | None,
    limiter: asyncio.Semaphore | None,
) -> tuple[Choice, int]:
    """One request with the history so far (ART's `trajectory.messages()`) and the tools on
    the trajectory: the sampled `Choice` and its completion tokens."""
    seed = turn_seed(sampling.seed, index)
    optional: dict[str, Any] = {
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


@tracing.op("art_rlvr.env", inputs=tracing.env_inputs, output=tracing.env_output)
async def ask_env(
    env: Environment, turn: Turn, trajectory: art.Trajectory, timeout_s: float
) -> Reply:
    """The environment's answer; raises `CallbackError` if it fails or answers nonsense."""
    value = await guarded(
        env, (turn, trajectory), timeout_s=timeout_s, what="environment", detail_chars=LOG_CHARS
    )
    try:
        return env_reply(value)
    except TypeError as error:
        raise CallbackError(str(error)) from None


async def score_episode(score: Scorer, trajectory: art.Trajectory, timeout_s: float) -> Score:
    """The scorer's verdict as a `Score` (a number in [0, 1] or a bool, as a reward may
    return); raises `CallbackError` if it fails or returns anything else."""
    value = await guarded(
        score, (trajectory,), timeout_s=timeout_s, what="scorer", detail_chars=LOG_CHARS
    )
    try:
        return as_score(value)
    except (TypeError, ValidationError) as error:
        raise CallbackError(f"scorer {error}") from None


@tracing.op("art_rlvr.episode", inputs=_episode_inputs, output=_episode_output)
async def run_episode(
    model: art.Model,
    messages: Iterable[Mapping[str, Any]],
    *,
    tools: Iterable[Callable[..., Any] | Tool] = (),
    tool_choice: ToolChoice | None = None,
    reset_tool_choice: bool = True,
    env: Environment | None = None,
    score: Scorer | None = None,
    max_turns: int = DEFAULT_MAX_TURNS,
    sampling: SamplingConfig = SamplingConfig(),
    step: int | None = None,
    callback_timeout_s: float = DEFAULT_CALLBACK_TIMEOUT_S,
    metadata: dict[str, Any] | None = None,
    limiter: asyncio.Semaphore | None = None,
) -> art.Trajectory:
    """One episode from `messages` as a single `art.Trajectory` holding every sampled `Choice`.

    `tools`: functions or `Tool`s (see art_rlvr.tools); their schemas go with every request
    and onto `Trajectory.tools`. `tool_choice` ("auto", "required", "none" or a tool's name)
    applies until the model has called a tool, then falls back to the server's default, as
    the OpenAI Agents SDK's `reset_tool_choice` does: a forced call on every turn would never
    let the model answer (`reset_tool_choice=False` keeps it). `sampling.seed` seeds turn 0;
    later turns get seeds derived from it. `limiter`, if given, is held while a request is
    open. Backend errors (HTTP, no choices) raise, as in `rollout`."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    toolbox = as_tools(tools)
    schemas = [t.definition for t in toolbox.values()]
    trajectory = art.Trajectory(
        messages_and_choices=[art_message(m) for m in messages],
        tools=art_tools(schemas) if schemas else None,
        metadata=dict(metadata or {}),
    )
    choice_param = tool_choice_param(tool_choice) if schemas else None
    results: list[ToolCallResult] = []
    counts: Counter[str] = Counter()  # turns, tokens and flags
    env_metrics: Counter[str] = Counter()  # summed over turns
    for index in range(max_turns):
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
        if calls and reset_tool_choice:
            choice_param = None
        reply = Reply()
        if env is not None:
            turn = Turn(index=index, choice=choice, tool_results=tuple(turn_results))
            try:
                reply = await ask_env(env, turn, trajectory, callback_timeout_s)
            except CallbackError as error:
                counts["env_error"] = 1
                trajectory.logs.append(f"turn {index}: episode ended: {failure(error)}")
                break
            trajectory.messages_and_choices.extend(art_message(m) for m in reply.messages)
            env_metrics.update(reply.metrics)
            if reply.log:
                trajectory.logs.append(f"turn {index}: {reply.log}")
        if reply.done or not (calls or reply.messages):
            break
    else:
        counts["turn_cap_hit"] = 1
        trajectory.logs.append(f"turn cap: the episode wanted more than {max_turns} turns")
    trajectory.metrics.update(
        {
            **{k: float(counts[k]) for k in ("turns", "turn_cap_hit", "truncated_turns")},
            **tool_metrics(results),
            "completion_tokens": float(counts["completion_tokens"]),
            **({"env_error": float(counts["env_error"])} if env is not None else {}),
            **{k: float(v) for k, v in env_metrics.items()},
        }
    )
    if score is not None and not counts["env_error"]:
        try:
            verdict = await score_episode(score, trajectory, callback_timeout_s)
        except CallbackError as error:
            trajectory.metrics["score_error"] = 1.0
            trajectory.logs.append(f"scoring failed, reward 0: {failure(error)}")
        else:
            attach_outcome(
                trajectory,
                reward=verdict.reward,
                feedback=verdict.feedback,
                metrics={"score_error": 0.0, **verdict.metrics},
            )
    return trajectory


__all__ = [
    "DEFAULT_CALLBACK_TIMEOUT_S",
    "DEFAULT_MAX_TURNS",
    "CallbackError",
    "Environment",
    "Reply",
    "Score",
    "Scorer",
    "Turn",
    "ask_env",
    "failure",
    "run_episode",
    "sample_turn",
    "score_episode",
    "tool_metrics",
    "turn_seed",
]
