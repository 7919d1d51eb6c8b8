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
import inspect
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

DETAIL_CHARS = 80_000  # the most of a traceback kept for the logs


def cap(text: str, max_chars: int) -> tuple[str, bool]:
    """`text` cut to `max_chars`, with a note saying how much was left out."""
    if len(text) <= max_chars:
        return text, False
    note = f"\n[truncated: {len(text) - max_chars} of {len(text)} characters not shown]"
    return text[:max_chars] + note, True


def _in_thread(call: Callable[[], Any], label: str) -> asyncio.Future[Any]:
    """Run `call` in a daemon thread of its own; the future resolves on the loop. A call that
    outlives its awaiter finishes (or hangs) in the background and is ignored."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # cancelled by a timeout
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result, error = context.run(call), None
        except BaseException as caught:  # SystemExit from a tool is the tool's fault too
            result, error = None, caught
        with contextlib.suppress(RuntimeError):  # the loop closed while the tool still ran
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name=label, daemon=True).start()
    return future


def _identity(value: Any) -> Any:
    return value


async def off_loop(
    fn: Callable[..., Any],
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    label: str,
    then: Callable[[Any], Any] = _identity,
) -> Any:
    """`then(fn(*args, **kwargs))` without blocking the event loop: an async `fn` is awaited, a
    sync one runs in a daemon thread of its own (with `then`, so turning megabytes into text
    happens there too). Wrap it in `asyncio.timeout`: an async call is cancelled, a sync one
    abandoned. A sync function that returns an awaitable has it awaited on the loop."""
    args, kwargs = list(args), dict(kwargs or {})
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (an object with an async __call__)
    ):
        return then(await fn(*args, **kwargs))

    def run() -> Any:
        result = fn(*args, **kwargs)
        return result if inspect.isawaitable(result) else then(result)

    result = await _in_thread(run, label)
    return then(await result) if inspect.isawaitable(result) else result


class CallbackError(RuntimeError):
    """User code (a tool, an environment, a scorer) that raised or outlived its timeout;
    the message is one line, `detail` the traceback for the logs."""

    def __init__(self, message: str, *, timed_out: bool = False, detail: str | None = None) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.detail = message if detail is None else detail


async def guarded(
    fn: Callable[..., Any],
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    timeout_s: float,
    what: str,
    then: Callable[[Any], Any] = _identity,
    detail_chars: int = DETAIL_CHARS,
) -> Any:
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
    fn: Callable[..., Any], args: Iterable[Any] = (), *, timeout_s: float | None, what: str
) -> Any:
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


def call_within(fn: Callable[..., Any], args: Iterable[Any], *, timeout_s: float, what: str) -> Any:
    """From sync code (a scenario being loaded, perhaps in a notebook whose loop runs):
    `fn(*args)`, awaited if it returns an awaitable, in a daemon thread with a loop of its own,
    abandoned at the timeout with `CallbackTimeout`; whatever it raised is raised."""
    done = threading.Event()
    outcome: dict[str, Any] = {}

    async def settle(value: Any) -> Any:
        return await value

    def target() -> None:
        try:
            value = fn(*args)
            outcome["value"] = asyncio.run(settle(value)) if inspect.isawaitable(value) else value
        except BaseException as error:  # handed to the caller
            outcome["error"] = error
        finally:
            done.set()

    threading.Thread(target=target, name=what, daemon=True).start()
    if not done.wait(timeout_s):
        raise CallbackTimeout(f"{what} did not return within {timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
