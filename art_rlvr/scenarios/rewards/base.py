"""The reward contract: `R(x, y) -> Score`, deterministic, never raising on model output."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from art_rlvr.core.text import did_you_mean
from art_rlvr.core.types import Record, Score

RewardFn = Callable[[Record, str], Score | float | bool | Awaitable[Score | float | bool]]


class RewardTypeError(TypeError):
    """A reward returned something that is not a score."""


def as_score(value: object) -> Score:
    """A reward's return value as a `Score`: a Score, or a number in [0, 1] or a bool (the TRL
    and verifiers habit; True is 1.0 and counts as correct)."""
    if isinstance(value, Score):
        return value
    if isinstance(value, bool):
        return Score(reward=float(value), metrics={"correct": float(value)})
    if isinstance(value, int | float):
        if not 0.0 <= value <= 1.0:  # NaN fails too
            raise RewardTypeError(f"returned {value!r}; a reward's number is in [0, 1]")
        return Score(reward=float(value))
    raise RewardTypeError(
        f"returned {type(value).__name__}; a reward returns a Score, a float in [0, 1] or a bool"
    )


RewardFactory = Callable[..., RewardFn]


class RewardConfigError(ValueError):
    """A reward named in a scenario file cannot be built."""


def _import_path(target: str, near: Path | None = None) -> Any:
    """`module:attr`; a module not on the Python path is also looked for next to the scenario
    file (`near`), so `my_rewards.py` beside `mine.toml` needs no PYTHONPATH."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise RewardConfigError(f"reward import path {target!r} must look like 'module:function'")
    beside = near / f"{module_name}.py" if near is not None and module_name.isidentifier() else None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if beside is None or not beside.is_file() or error.name != module_name:
            raise RewardConfigError(
                f"cannot import module {module_name!r} for reward: {error}"
            ) from error
        module = _load_beside(module_name, beside)
    except ImportError as error:
        raise RewardConfigError(
            f"cannot import module {module_name!r} for reward: {error}"
        ) from error
    try:
        return getattr(module, attr)
    except AttributeError:
        raise RewardConfigError(f"module {module_name!r} has no attribute {attr!r}") from None


def exec_file(name: str, path: Path) -> ModuleType:
    """Import `path` as module `name` (kept in sys.modules, as an import would); whatever the
    file raises is raised, and it is left out of sys.modules."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _load_beside(name: str, path: Path) -> ModuleType:
    try:
        return exec_file(name, path)
    except Exception as error:
        raise RewardConfigError(f"cannot import {path} for reward: {error}") from error


def build_reward(
    name: str,
    params: dict[str, object],
    registry: Mapping[str, RewardFactory],
    near: Path | None = None,
) -> RewardFn:
    """A built-in reward by name, or `module:function` (a reward, or a factory taking params),
    the module on the Python path or next to the scenario file (`near`)."""
    if ":" in name:
        target = _import_path(name, near)
        if not callable(target):
            raise RewardConfigError(f"{name!r} is not callable")
        return target(**params) if params else target
    if name not in registry:
        raise RewardConfigError(
            f"unknown reward {name!r}{did_you_mean(name, registry)}; built-in rewards: "
            f"{', '.join(sorted(registry))} (or 'module:function')"
        )
    try:
        return registry[name](**params)
    except (TypeError, ValidationError) as error:
        raise RewardConfigError(f"bad parameters for reward {name!r}: {error}") from error


def first_error(error: ValidationError) -> str:
    """A pydantic error as one line: `field.path: message` (scenario errors stay one line)."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "params"
    return f"{where}: {first['msg']}"
