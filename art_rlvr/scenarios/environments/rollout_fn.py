"""A user's ART rollout function named by a scenario: found, imported and its signature checked
at load time, so a typo costs milliseconds, not a model load.

The function is ART's own shape, `async def rollout(model, record) -> art.Trajectory`, optionally
with a third parameter named `context` (or annotated `RolloutContext`) that receives
art_rlvr's `RolloutContext` (the system prompt GEPA evolves, the sampling settings and seed). A
third parameter of another name (ART's 2048 example: `rollout(model, step, is_validation)`) is
no context: with a default it is left to it, without one the function is refused, never handed
a context it does not expect. It is named as `module:function` (on the Python path, or a module
beside the scenario file) or `path/to/file.py:function` (relative to the scenario file); the
file's folder goes on `sys.path` first, as `python file.py` would put it, so the helpers beside
it import (`from utils import ...`). How it runs and is scored is art_rlvr.rollouts' job.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from art_rlvr.scenarios.rewards.base import exec_file

if TYPE_CHECKING:
    import art


class RolloutFunctionConfigError(ValueError):
    """A rollout function named by a scenario cannot be used: the scenario file says where."""


class RolloutFailed(Exception):
    """Raised by a built-in rollout function (a verifiers episode) that failed on one record
    but sampled something first: `trajectory` keeps it (it trains with reward 0), `reason`
    says why in the failing library's own words."""

    def __init__(self, trajectory: art.Trajectory, reason: str) -> None:
        super().__init__(reason)
        self.trajectory = trajectory
        self.reason = reason


class RolloutFunction(BaseModel):
    """A checked rollout function: `takes_context` says whether it has the third parameter."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    ref: str
    fn: Callable[..., Awaitable[object]]
    takes_context: bool


CONTEXT_NAMES = ("context", "ctx")


def positional_params(fn: Callable[..., object]) -> list[inspect.Parameter]:
    params = inspect.signature(fn).parameters.values()
    return [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def positional_arity(fn: Callable[..., object]) -> tuple[int, int]:
    """(required, accepted) positional parameters; accepted is large for `*args`."""
    params = inspect.signature(fn).parameters.values()
    positional = positional_params(fn)
    required = sum(p.default is p.empty for p in positional)
    varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    return required, 1_000 if varargs else len(positional)


def is_context(param: inspect.Parameter) -> bool:
    """A third parameter that asks for art_rlvr's context: by its name or its annotation."""
    annotation = getattr(param.annotation, "__name__", param.annotation)
    return param.name in CONTEXT_NAMES or "RolloutContext" in str(annotation)


def takes_context(fn: Callable[..., object], ref: str) -> bool:
    """Whether the function is handed a context: its third positional parameter is one (by
    name or annotation), or it takes `*args`; one with a default that is not (a flag of its
    own) is left to it; a required one that is not (2048's `is_validation`) is refused."""
    params = positional_params(fn)
    if len(params) < 3:
        return positional_arity(fn)[1] >= 3  # `*args`
    third = params[2]
    if is_context(third):
        return True
    if third.default is third.empty:
        names = ", ".join(p.name for p in params)
        raise RolloutFunctionConfigError(
            f"rollout {ref!r} takes ({names}): art_rlvr calls a rollout as (model, record) or "
            f"(model, record, context), and its third parameter {third.name!r} is not a "
            "context (name it `context`); wrap it: `async def rollout(model, record): return "
            "await <yours>(model, ...)`"
        )
    return False


def check_rollout_function(fn: object, ref: str) -> RolloutFunction:
    """`fn` as a `RolloutFunction`, or why it is none: not callable, not `async def`, or a
    signature that cannot take (model, record) or (model, record, context)."""
    if not callable(fn):
        raise RolloutFunctionConfigError(
            f"rollout {ref!r} is a {type(fn).__name__}, not a function"
        )
    target = fn.__call__ if not inspect.isfunction(fn) and not inspect.ismethod(fn) else fn
    if not inspect.iscoroutinefunction(target):
        raise RolloutFunctionConfigError(
            f"rollout {ref!r} is not an async function: write `async def rollout(model, record)` "
            "returning an art.Trajectory"
        )
    try:
        required, accepted = positional_arity(fn)
    except (TypeError, ValueError) as error:
        raise RolloutFunctionConfigError(
            f"rollout {ref!r}: no signature to check ({error})"
        ) from None
    if required > 3 or accepted < 2:
        raise RolloutFunctionConfigError(
            f"rollout {ref!r} takes {required} required positional parameter(s) and at most "
            f"{accepted}: it must accept (model, record) or (model, record, context)"
        )
    return RolloutFunction(ref=ref, fn=fn, takes_context=takes_context(fn, ref))


def import_module_from(module: str, near: Path | None) -> ModuleType:
    """`module` from a file path (`x/y.py`, relative to `near`), the Python path, or a module
    file beside the scenario (`near/<module>.py`)."""
    if module.endswith(".py"):
        path = Path(module) if near is None else near / module
        return load_file(path.resolve())
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        beside = near / f"{module}.py" if near is not None and module.isidentifier() else None
        if beside is None or not beside.is_file() or error.name != module:
            raise RolloutFunctionConfigError(f"cannot import module {module!r}: {error}") from None
        return load_file(beside)
    except Exception as error:
        raise RolloutFunctionConfigError(
            f"importing module {module!r} raised {type(error).__name__}: {error}"
        ) from None


def put_on_path(folder: Path) -> None:
    """`folder` first on `sys.path`, as `python <folder>/file.py` has it: ART's examples import
    the helpers beside them (`from utils import ...`), at import time and inside functions."""
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def load_file(path: Path) -> ModuleType:
    """The module in `path`, under its file name (once: a second scenario naming it reuses it)."""
    if not path.is_file():
        raise RolloutFunctionConfigError(f"no file {path}")
    loaded = sys.modules.get(path.stem)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    put_on_path(path.parent)
    try:
        return exec_file(path.stem, path)
    except Exception as error:
        raise RolloutFunctionConfigError(
            f"importing {path} raised {type(error).__name__}: {error}"
        ) from None


def load_rollout_function(ref: str, near: Path | None = None) -> RolloutFunction:
    """The function `ref` (`module:function` or `file.py:function`) names, checked."""
    module, sep, attr = ref.rpartition(":")
    if not sep or not module or not attr.isidentifier():
        raise RolloutFunctionConfigError(
            f"rollout {ref!r} must look like 'module:function' or 'path/to/file.py:function'"
        )
    found = import_module_from(module, near)
    if not hasattr(found, attr):
        public = sorted(n for n in vars(found) if not n.startswith("_"))
        raise RolloutFunctionConfigError(
            f"module {module!r} has no attribute {attr!r}; it has: {', '.join(public) or 'none'}"
        )
    return check_rollout_function(getattr(found, attr), ref)


__all__ = [
    "RolloutFailed",
    "RolloutFunction",
    "RolloutFunctionConfigError",
    "check_rollout_function",
    "load_rollout_function",
]
