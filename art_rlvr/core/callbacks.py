"""User code called without stopping the event loop, and under a timeout: rewards, tools,
environments. An async callable is awaited and cancelled at its timeout; a sync one runs in a
daemon thread of its own, whose result is abandoned at the timeout (Python cannot kill a
thread: a call that never returns keeps its thread, asleep or spinning, until the process
exits, and never holds up the loop, a pool, or the process's exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import threading
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import overload

DETAIL_CHARS = 80_000  # the most of a traceback kept for the logs


def cap(text: str, max_chars: int) -> tuple[str, bool]:
    """`text` cut to `max_chars`, with a note saying how much was left out."""
    if len(text) <= max_chars:
        return text, False
    note = f"\n[truncated: {len(text) - max_chars} of {len(text)} characters not shown]"
    return text[:max_chars] + note, True


def _in_thread[R](call: Callable[[], R], label: str) -> asyncio.Future[R]:
    """Run `call` in a daemon thread of its own; the future resolves on the loop. A call that
    outlives its awaiter finishes (or hangs) in the background and is ignored."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[R] = loop.create_future()
    context = contextvars.copy_context()

    def settle(resolve: Callable[[], None]) -> None:
        if not future.done():  # else cancelled by a timeout
            resolve()

    def target() -> None:
        try:
            result = context.run(call)
        except BaseException as caught:  # SystemExit from a tool is the tool's fault too
            resolve = functools.partial(future.set_exception, caught)
        else:
            resolve = functools.partial(future.set_result, result)
        with contextlib.suppress(RuntimeError):  # the loop closed while the tool still ran
            loop.call_soon_threadsafe(settle, resolve)

    threading.Thread(target=target, name=label, daemon=True).start()
    return future


@dataclass(frozen=True)
class _Awaiting:
    """What a sync function returned when it was an awaitable, to be awaited on the loop."""

    value: Awaitable[object]


def _identity(value: object) -> object:
    return value


async def off_loop(
    fn: Callable[..., object],
    args: Iterable[object] = (),
    kwargs: Mapping[str, object] | None = None,
    *,
    label: str,
    then: Callable[[object], object] = _identity,
) -> object:
    """`then(fn(*args, **kwargs))` without blocking the event loop: an async `fn` is awaited, a
    sync one runs in a daemon thread of its own (with `then`, so turning megabytes into text
    happens there too). Wrap it in `asyncio.timeout`: an async call is cancelled, a sync one
    abandoned. A sync function that returns an awaitable has it awaited on the loop."""
    positional, named = list(args), dict(kwargs or {})
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (an object with an async __call__)
    ):
        coroutine = fn(*positional, **named)
        assert inspect.isawaitable(coroutine)
        return then(await coroutine)

    def run() -> object:
        result = fn(*positional, **named)
        return _Awaiting(result) if inspect.isawaitable(result) else then(result)

    result = await _in_thread(run, label)
    return then(await result.value) if isinstance(result, _Awaiting) else result


class CallbackError(RuntimeError):
    """User code (a tool, an environment, a scorer) that raised or outlived its timeout;
    the message is one line, `detail` the traceback for the logs."""

    def __init__(self, message: str, *, timed_out: bool = False, detail: str | None = None) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.detail = message if detail is None else detail


@overload
async def guarded(
    fn: Callable[..., object],
    args: Iterable[object] = (),
    kwargs: Mapping[str, object] | None = None,
    *,
    timeout_s: float,
    what: str,
    detail_chars: int = DETAIL_CHARS,
) -> object: ...
@overload
async def guarded[T](
    fn: Callable[..., object],
    args: Iterable[object] = (),
    kwargs: Mapping[str, object] | None = None,
    *,
    timeout_s: float,
    what: str,
    then: Callable[[object], T],
    detail_chars: int = DETAIL_CHARS,
) -> T: ...
async def guarded(
    fn: Callable[..., object],
    args: Iterable[object] = (),
    kwargs: Mapping[str, object] | None = None,
    *,
    then: Callable[[object], object] = _identity,  # run with the call (in its thread)
    timeout_s: float,
    what: str,
    detail_chars: int = DETAIL_CHARS,
) -> object:
    """`off_loop` under `timeout_s`; any failure of the call becomes a `CallbackError` saying
    what failed and why. Cancellation from outside still propagates."""
    scope = asyncio.timeout(timeout_s)
    try:
        async with scope:
            return await off_loop(fn, args, kwargs, label=what, then=then)
    except Exception as error:
        if scope.expired():
            message = f"{what} timed out after {timeout_s:g} s"
            raise CallbackError(message, timed_out=True, detail=message) from None
        detail, _ = cap("".join(traceback.format_exception(error)), detail_chars)
        message = f"{what} raised {type(error).__name__}: {error}"
        raise CallbackError(message, timed_out=False, detail=detail) from error


class CallbackTimeout(TimeoutError):
    """User code that did not return within its timeout (the message says what and how long)."""


async def within(
    fn: Callable[..., object], args: Iterable[object] = (), *, timeout_s: float | None, what: str
) -> object:
    """`off_loop` under `timeout_s` (None: no limit): `CallbackTimeout` at the timeout,
    whatever the call raised as itself (a reward's bug is not a timeout). Cancellation from
    outside still propagates."""
    scope = asyncio.timeout(timeout_s)
    try:
        async with scope:
            return await off_loop(fn, args, label=what)
    except TimeoutError:
        if scope.expired():
            raise CallbackTimeout(f"{what} did not return within {timeout_s:g} s") from None
        raise


def call_within(
    fn: Callable[..., object], args: Iterable[object], *, timeout_s: float, what: str
) -> object:
    """From sync code (a scenario being loaded, perhaps in a notebook whose loop runs):
    `fn(*args)`, awaited if it returns an awaitable, in a daemon thread with a loop of its own,
    abandoned at the timeout with `CallbackTimeout`; whatever it raised is raised."""
    done = threading.Event()
    values: list[object] = []
    errors: list[BaseException] = []

    async def settle(value: Awaitable[object]) -> object:
        return await value

    def target() -> None:
        try:
            value = fn(*args)
            values.append(asyncio.run(settle(value)) if inspect.isawaitable(value) else value)
        except BaseException as error:  # handed to the caller
            errors.append(error)
        finally:
            done.set()

    threading.Thread(target=target, name=what, daemon=True).start()
    if not done.wait(timeout_s):
        raise CallbackTimeout(f"{what} did not return within {timeout_s:g} s")
    if errors:
        raise errors[0]
    return values[0]
