"""The reward contract: `R(x, y) -> Score`, deterministic, never raising on model output."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from art_rlvr.outcome import correct_from

Record = Mapping[str, Any]


class Score(BaseModel):
    """What a reward says about one completion: the number, why, and countable facts."""

    model_config = ConfigDict(frozen=True)

    reward: float = Field(ge=0.0, le=1.0)
    feedback: str = ""
    metrics: dict[str, float] = Field(default_factory=dict)

    @property
    def correct(self) -> bool:
        return correct_from(self.reward, self.metrics)


RewardFn = Callable[[Record, str], Score | Awaitable[Score]]
RewardFactory = Callable[..., RewardFn]


class RewardConfigError(ValueError):
    """A reward named in a scenario file cannot be built."""


def _import_path(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise RewardConfigError(f"reward import path {target!r} must look like 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise RewardConfigError(
            f"cannot import module {module_name!r} for reward: {error}"
        ) from error
    try:
        return getattr(module, attr)
    except AttributeError:
        raise RewardConfigError(f"module {module_name!r} has no attribute {attr!r}") from None


def build_reward(
    name: str, params: dict[str, Any], registry: Mapping[str, RewardFactory]
) -> RewardFn:
    """A built-in reward by name, or `module:function` (a reward, or a factory taking params)."""
    if ":" in name:
        target = _import_path(name)
        if not callable(target):
            raise RewardConfigError(f"{name!r} is not callable")
        return target(**params) if params else target
    if name not in registry:
        raise RewardConfigError(f"unknown reward {name!r}; built-in rewards: {sorted(registry)}")
    try:
        return registry[name](**params)
    except (TypeError, ValidationError) as error:
        raise RewardConfigError(f"bad parameters for reward {name!r}: {error}") from error


def first_error(error: ValidationError) -> str:
    """A pydantic error as one line: `field.path: message` (scenario errors stay one line)."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "params"
    return f"{where}: {first['msg']}"
