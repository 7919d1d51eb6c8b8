"""The environment contract: what an `[environment]` factory returns, and how it is found.

An environment is data plus pure functions of the record `x` and the episode so far (message
dicts, the way `art_rlvr.core.outcome.turns` gives them): no object lives across turns, so state (a
board, attempts used) is replayed from the messages. Only the scenario's own module reads `x`.
The rollout runs `respond` and `reward` off the event loop under a timeout; whatever they
raise ends that episode with zero reward and the reason in its logs, never the run.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from art_rlvr.core.text import did_you_mean
from art_rlvr.core.types import Messages, Record, Reply, Score

Respond = Callable[[Record, Messages], "Reply | str | Awaitable[Reply | str | None] | None"]
EpisodeReward = Callable[[Record, Messages], Score | Awaitable[Score]]


class Environment(BaseModel):
    """What a factory named in `[environment]` returns.

    `opening(x)`: the messages after the system prompt (default: the scenario's
    `user_template`); it renders a prompt, so it must be quick and pure. `respond(x, episode)`:
    the answer to the last assistant turn (None: nothing to add). `reward(x, episode)`:
    R(x, trajectory) as a `Score` (default: the scenario's `[reward]` on the last reply).
    `tools`: plain functions the model may call (schemas from signature and docstring).
    `max_turns`: sampled turns before the episode is cut (the TOML's `max_turns` wins)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    opening: Callable[[Record], Sequence[Mapping[str, str]]] | None = None
    respond: Respond | None = None
    reward: EpisodeReward | None = None
    tools: tuple[Callable[..., object], ...] = ()
    max_turns: int = Field(default=8, ge=1)


class EnvironmentConfigError(ValueError):
    """An environment named in a scenario file cannot be built."""


EnvironmentFactory = Callable[..., Environment]


def build_environment(
    name: str, params: Mapping[str, object], registry: Mapping[str, EnvironmentFactory]
) -> Environment:
    """A built-in environment by name, or `module:function` (a factory called with params)."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except ImportError as error:
            raise EnvironmentConfigError(f"cannot import {module_name!r}: {error}") from None
        except AttributeError:
            raise EnvironmentConfigError(f"{module_name!r} has no attribute {attr!r}") from None
    elif name in registry:
        factory = registry[name]
    else:
        raise EnvironmentConfigError(
            f"unknown environment {name!r}{did_you_mean(name, registry)}; built-in: "
            f"{', '.join(sorted(registry))} (or 'module:function')"
        )
    try:
        built = factory(**params)
    except (TypeError, ValidationError, ValueError) as error:
        detail = " ".join(str(error).split())
        raise EnvironmentConfigError(f"bad parameters for environment {name!r}: {detail}") from None
    if not isinstance(built, Environment):
        raise EnvironmentConfigError(
            f"environment factory {name!r} returned {type(built).__name__}, not Environment"
        )
    return built


def assistant_texts(episode: Messages) -> list[str]:
    """The assistant turns' text, in order (a turn with only tool calls is '')."""
    return [str(m.get("content") or "") for m in episode if m.get("role") == "assistant"]


__all__ = [
    "Environment",
    "EnvironmentConfigError",
    "EnvironmentFactory",
    "EpisodeReward",
    "Messages",
    "Record",
    "Reply",
    "Respond",
    "assistant_texts",
    "build_environment",
]
