"""What one client can hold of the server: connections, and time before its request is in.

uvicorn bounds an idle connection only after a response (`timeout_keep_alive`): a connection
that never sends a byte, or sends half a request head, is held for ever, and each holds a file
descriptor. With `ulimit -n 1024`, 1,100 of them made `accept()` fail (EMFILE) and asyncio log
a traceback per attempt, and nothing else was served. So the server's HTTP protocol
(`guarded_protocol`, uvicorn's h11 one underneath):

- closes a connection whose request head has not arrived `head_timeout_s` after it opened or
  after its first byte (a half-sent request); uvicorn's own keep-alive timer covers the time
  between requests;
- keeps at most `max_connections` open (half the soft descriptor limit by default, so the rest
  of the process keeps descriptors of its own): a new connection closes the oldest idle one
  (no request in flight); when every one is busy, it is answered 503 and closed; the listen
  backlog, which is also how many connections asyncio accepts at once, stays within the
  descriptors left (`ConnectionLimits.backlog`);
- logs one line for what it closed, at most one a second, and one line (not uvicorn's
  traceback) for a request still running when the shutdown's grace ran out and uvicorn
  cancelled it (`CutAtShutdown`).

`quiet_accept_errors` makes a failed `accept()` one line too (at most one a second) instead of
asyncio's traceback per attempt.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


DESCRIPTOR_TARGET = 65536


def raise_descriptor_limit(target: int = DESCRIPTOR_TARGET) -> int:
    """Lift this process's soft limit on open files towards its hard limit (at most `target`),
    as Go's runtime does for every program: shells start at a soft 1024 with a hard limit far
    above, and a server that keeps half its descriptors for connections would let idle
    clients churn a small cap (under a busy CPU, a normal request waited 3.5 s at 1024 against
    0.05 s at 8192). Returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            log.debug("open files: soft limit raised from %d to %d", soft, want)
        except (ValueError, OSError) as error:
            log.debug("open files: soft limit kept at %d (%s)", soft, error)
    return soft_descriptor_limit()


def soft_descriptor_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 65536


def default_max_connections() -> int:
    return max(16, soft_descriptor_limit() // 2)


class ConnectionLimits(BaseModel):
    """The server's limits on connections and slow requests."""

    model_config = ConfigDict(frozen=True)

    head_timeout_s: float = Field(default=15.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)
    max_connections: int = Field(default_factory=default_max_connections, ge=1)
    graceful_shutdown_s: int = Field(default=5, ge=0)  # for in-flight requests, after SIGTERM

    @property
    def backlog(self) -> int:
        """The listen backlog, which is also how many connections asyncio accepts in one go
        before any of them runs `connection_made` (where the cap is kept): small enough that a
        burst fits the descriptors the cap leaves, or accept() fails with EMFILE (and asyncio
        schedules a retry per failed accept)."""
        spare = soft_descriptor_limit() - self.max_connections
        return max(8, min(2048, spare // 4))


class OncePerSecond:
    """A log line at most once a second, with how many were folded into it."""

    def __init__(self) -> None:
        self.last = 0.0
        self.folded = 0

    def warn(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self.last < 1.0:
            self.folded += 1
            return
        more = f" (and {self.folded} more in the last second)" if self.folded else ""
        log.warning(message + more, *args)
        self.last, self.folded = now, 0


BUSY = json.dumps(
    {"error": {"message": "too many open connections", "type": "server_error", "code": 503}}
).encode()
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"connection: close\r\nretry-after: 1\r\ncontent-length: "
    + str(len(BUSY)).encode()
    + b"\r\n\r\n"
    + BUSY
)


class CutAtShutdown(logging.LoggerAdapter):
    """uvicorn's logger for a connection, where a request cancelled at shutdown (what still
    runs when the grace is over) is one line instead of "Exception in ASGI application" and
    its traceback; anything else is logged as uvicorn logs it."""

    @property
    def level(self) -> int:  # uvicorn reads its logger's level
        return self.logger.level

    def error(self, msg: object, *args: object, **kwargs: object) -> None:
        if isinstance(kwargs.get("exc_info"), asyncio.CancelledError):
            self.logger.warning("cut a request still running at shutdown")
            return
        self.logger.error(msg, *args, **kwargs)


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol, with the limits above (set by `guarded_protocol`)."""

    limits: ConnectionLimits = ConnectionLimits()
    closed_log: OncePerSecond = OncePerSecond()
    head_timer: asyncio.TimerHandle | None = None
    last_active: float = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = CutAtShutdown(self.logger)  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.last_active = self.loop.time()
        self._arm_head_timer()
        open_now = sum(not c.transport.is_closing() for c in self.connections)
        if open_now > self.limits.max_connections:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.last_active = self.loop.time()
        if self.idle and self.head_timer is None:  # the first byte of a next request
            self._arm_head_timer()
        super().data_received(data)
        if not self.idle:  # a whole request head is in
            self._cancel_head_timer()

    @property
    def idle(self) -> bool:
        """No request in flight (none yet, half a head, or the last one answered)."""
        return self.cycle is None or self.cycle.response_complete

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self.head_timer = self.loop.call_later(self.limits.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.idle and not self.transport.is_closing():
            self.closed_log.warn(
                "closed a connection from %s: no whole request within %g s",
                _peer(self.client),
                self.limits.head_timeout_s,
            )
            self.transport.close()

    def _make_room(self) -> None:
        """Over the cap: close the oldest idle connection, or answer this one 503."""
        idle = [
            c
            for c in self.connections
            if c is not self and getattr(c, "idle", False) and not c.transport.is_closing()
        ]
        if idle:
            oldest = min(idle, key=lambda c: getattr(c, "last_active", 0.0))
            self.closed_log.warn(
                "%d connections open (the most is %d): closed the oldest idle one, from %s",
                len(self.connections),
                self.limits.max_connections,
                _peer(getattr(oldest, "client", None)),
            )
            oldest.transport.close()
            return
        self.closed_log.warn(
            "%d connections open, all busy (the most is %d): answered 503",
            len(self.connections),
            self.limits.max_connections,
        )
        self.transport.write(BUSY_RESPONSE)
        self.transport.close()


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "?"


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11]:
    """A protocol class for one server, with its own limits and its own log throttle."""
    return type("GuardedH11", (GuardedH11,), {"limits": limits, "closed_log": OncePerSecond()})


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio logs a traceback for every failed accept() (EMFILE: out of descriptors): one
    line a second instead; anything else goes to the default handler."""
    throttle = OncePerSecond()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        error = context.get("exception")
        if isinstance(error, OSError) and "accept" in str(context.get("message", "")):
            throttle.warn("cannot accept a connection: %s", error.strerror or error)
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(handle)
