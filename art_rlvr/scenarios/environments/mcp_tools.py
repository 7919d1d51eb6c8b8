"""Tools from an MCP server (the official `mcp` SDK, 2.0): a stdio command or a URL on loopback.

A scenario names the server in `[environment] name = "mcp"` (or a factory puts `McpServer.load(
spec).tools` among its own tools). Loading the scenario starts the server once, lists its tools
and checks each one, so a server that does not start, or declares a tool the OpenAI `tools` list
cannot carry (a name outside `[A-Za-z0-9_-]{1,64}`, an input schema that is not a JSON Schema
object), is an error naming the scenario file and line, before any model is loaded.

Each listed tool becomes an `McpTool`: a callable that brings its own JSON schema, which
`rollouts.tools.tool` turns into a `Tool` like any function, so MCP calls run under the same
timeout, output cap and error-as-tool-message rules. What the server says goes back to the
model: a result with `is_error` (the tool raised, the server refused the arguments) is an error
tool message; so is a server that dies during a call (`Connection closed`), and the server is
restarted at once in the background for the calls after it (up to `max_restarts` times a run),
the crash counted in `McpServer.counts`.

The connection lives in an owner task of the running event loop (the SDK's transports are
anyio task groups, which must be entered and left by one task): started by `start()` (the CLI
does so when a run starts) or by the first call, and closed by `aclose()` (the CLI does so when
the run ends; a loop that shuts down cancels the owner, which closes it too). Closing a stdio
client ends the server's process tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, TextIO, cast
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from art_rlvr.scenarios.environments.base import Environment

if TYPE_CHECKING:
    import mcp
    import mcp.types

log = logging.getLogger(__name__)

CONNECTION_CLOSED = -32000  # mcp_types.jsonrpc.CONNECTION_CLOSED
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what the OpenAI `tools` list accepts
LOOPBACK = ("127.0.0.1", "localhost", "::1")
STDERR_CHARS = 600
CLOSE_TIMEOUT_S = 10.0


class McpServerError(ValueError):
    """An MCP server that cannot be used: it does not start, or it declares a bad tool."""


class McpToolError(RuntimeError):
    """The server's answer was an error result (`is_error`): the tool raised or refused."""


class McpServerCrashed(RuntimeError):
    """The server went away during a call (restarted in the background for the next ones)."""


class McpServerSpec(BaseModel):
    """Which server, and the limits it runs under: exactly one of `command` (argv of a stdio
    server; relative paths are relative to `cwd`, by default the directory the run starts in),
    `module` (the same as `command = ["python", "-m", module]`) or `url` (a streamable-HTTP
    endpoint on 127.0.0.1 / localhost)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    command: tuple[str, ...] | None = Field(default=None, min_length=1)
    module: str | None = None
    url: str | None = None
    env: dict[str, str] = Field(default_factory=dict)  # added to the SDK's safe default set
    cwd: str | None = None
    tools: tuple[str, ...] | None = None  # expose only these (default: every listed tool)
    startup_timeout_s: float = Field(default=30.0, gt=0)
    max_restarts: int = Field(default=3, ge=0)

    @model_validator(mode="after")
    def _one_server(self) -> McpServerSpec:
        given = [k for k in ("command", "module", "url") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of command, module or url (got {', '.join(given) or 'none'})"
            )
        if self.url is not None:
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or parts.hostname not in LOOPBACK:
                raise ValueError(
                    f"url {self.url!r}: an MCP server URL must be http(s) on 127.0.0.1 or "
                    "localhost (runs talk to loopback only)"
                )
        if self.url is not None and (self.env or self.cwd):
            raise ValueError("env and cwd apply to a command the run starts, not to a url")
        return self

    @property
    def argv(self) -> list[str]:
        """The server's command line: `python` (or `python3`) as its first word is the Python
        running the run, whose packages (`mcp` among them) the server then has too."""
        if self.module is not None:
            return [sys.executable, "-m", self.module]
        first, *rest = self.command or ("",)
        return [sys.executable if first in ("python", "python3") else first, *rest]

    @property
    def label(self) -> str:
        """The server as messages name it: its URL or its command line as written."""
        if self.module is not None:
            return f"python -m {self.module}"
        return self.url or " ".join(self.command or ())


@dataclass(frozen=True, eq=False)
class McpTool:
    """One tool of a server as a callable with its own schema (`rollouts.tools.DeclaredTool`):
    `await tool(**arguments)` is the server's answer as text."""

    server: McpServer = field(repr=False, compare=False)
    name: str
    description: str
    input_schema: dict[str, object]

    async def __call__(self, **arguments: object) -> str:
        return await self.server.call(self.name, arguments)


def leaf(error: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups, as the SDK's task groups raise."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def stderr_tail(errlog: IO[str] | None) -> str:
    """The end of what a stdio server wrote to stderr, for a message ('' if none). Read
    with `pread`, which leaves the offset the server shares with us where it is."""
    if errlog is None:
        return ""
    with contextlib.suppress(OSError, ValueError):
        fd = errlog.fileno()
        size = os.fstat(fd).st_size
        start = max(0, size - 4 * STDERR_CHARS)
        text = os.pread(fd, size - start, start).decode("utf-8", errors="replace").strip()
        return text[-STDERR_CHARS:]
    return ""


def startup_error(spec: McpServerSpec, error: BaseException, errlog: IO[str] | None) -> str:
    """Why a server did not start, in one sentence, with what it wrote to stderr."""
    cause = leaf(error)
    code = getattr(cause, "code", None)
    if isinstance(cause, FileNotFoundError):
        why = f"command not found: {spec.argv[0]}"
    elif isinstance(cause, TimeoutError):
        why = f"it did not answer within {spec.startup_timeout_s:g} s"
    elif code == CONNECTION_CLOSED:
        why = "it closed the connection before answering (exited, or wrote something other "
        why += "than JSON-RPC to stdout)"
    else:
        why = one_line(cause)
    return f"MCP server `{spec.label}` did not start: {why}{stderr_note(errlog)}"


def stderr_note(errlog: IO[str] | None, lines: int = 3) -> str:
    """`; its stderr ends: <the last few lines>` ('' when it wrote nothing)."""
    tail = [line.strip() for line in stderr_tail(errlog).splitlines() if line.strip()]
    return f"; its stderr ends: {' | '.join(tail[-lines:])}" if tail else ""


def schema_problem(tool: mcp.types.Tool) -> str | None:
    """Why a listed tool cannot be offered to a model (None: it can)."""
    import jsonschema

    if not TOOL_NAME.match(tool.name):
        return "its name is not 1-64 letters, digits, '_' or '-' (what OpenAI tools accept)"
    schema = tool.input_schema
    if not isinstance(schema, dict) or schema.get("type") != "object":
        kind = schema.get("type") if isinstance(schema, dict) else type(schema).__name__
        return f'its input schema is not a JSON Schema object (type {kind!r}, not "object")'
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as error:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        return f"its input schema is malformed at {where}: {error.message}"
    return None


def result_text(result: mcp.types.CallToolResult) -> str:
    """A tool result's content as the text a model reads: text blocks as they are, other
    blocks as a bracketed note; structured content as JSON when there is no block."""
    parts = [block_text(b) for b in result.content or ()]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


def block_text(block: Any) -> str:
    kind = getattr(block, "type", "")
    if kind == "text":
        return block.text
    if kind == "resource":
        text = getattr(block.resource, "text", None)
        return text if text is not None else f"[binary resource {block.resource.uri}]"
    if kind == "resource_link":
        return f"[resource link: {block.uri}]"
    return f"[{kind or 'unknown'} content ({getattr(block, 'mime_type', '?')}), not shown]"


def run_in_thread[T](make: Callable[[], Coroutine[object, object, T]]) -> T:
    """`asyncio.run(make())` on a thread of its own: usable from sync code that may itself be
    running inside an event loop (a notebook loading a scenario)."""
    values: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            values.append(asyncio.run(make()))
        except BaseException as error:  # handed back to the caller's thread
            errors.append(error)

    thread = threading.Thread(target=target, name="mcp-load", daemon=True)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return values[0]


@dataclass
class _Link:
    """A connection: the client (once ready), the task that owns its context, the event that
    ends it, and the file that holds a stdio server's stderr."""

    ready: asyncio.Future[mcp.Client]
    owner: asyncio.Task[None]
    stop: asyncio.Event
    errlog: IO[str] | None

    @property
    def client(self) -> mcp.Client:
        return self.ready.result()


def connection_lost(error: BaseException) -> bool:
    """Whether a call failed because the server went away (the SDK's `Connection closed`, or
    a transport stream that broke), not because of the call itself."""
    import anyio

    cause = leaf(error)
    if getattr(cause, "code", None) == CONNECTION_CLOSED:
        return True
    return isinstance(cause, anyio.ClosedResourceError | anyio.BrokenResourceError)


class McpServer:
    """One MCP server for a run; build it with `McpServer.load(spec)`."""

    def __init__(self, spec: McpServerSpec, listed: Sequence[mcp.types.Tool]) -> None:
        self.spec = spec
        self.tools: tuple[McpTool, ...] = tuple(
            McpTool(self, t.name, (t.description or "").strip(), dict(t.input_schema))
            for t in listed
        )
        self.counts = {"calls": 0, "starts": 0, "failed_starts": 0, "crashes": 0, "restarts": 0}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._link: _Link | None = None
        self._starting: asyncio.Task[_Link] | None = None
        self._down = False  # the last connection crashed or the last start failed
        self._closing: set[asyncio.Task[None]] = set()  # crashed connections being closed

    # ---------------------------------------------------------------- loading (sync)
    @classmethod
    def load(cls, spec: McpServerSpec) -> McpServer:
        """Start the server, list and check its tools, stop it: the load-time check."""
        listed = run_in_thread(lambda: list_tools(spec))
        names = [t.name for t in listed]
        if spec.tools is not None:
            if missing := [n for n in spec.tools if n not in names]:
                raise McpServerError(
                    f"MCP server `{spec.label}` has no tool(s) {missing}; it lists {names}"
                )
            listed = [t for t in listed if t.name in spec.tools]
        for tool in listed:
            if problem := schema_problem(tool):
                raise McpServerError(f"MCP server `{spec.label}`: tool {tool.name!r}: {problem}")
        if not listed:
            raise McpServerError(f"MCP server `{spec.label}` lists no tools")
        return cls(spec, listed)

    # ---------------------------------------------------------------- the connection
    async def start(self) -> None:
        """Connect now (rather than at the first call, whose timeout would pay for it)."""
        await self._live()

    async def call(self, name: str, arguments: dict[str, object]) -> str:
        """The tool's answer as text; an error result raises `McpToolError`, a server that
        went away during the call `McpServerCrashed` (after starting its restart)."""
        link = await self._live()
        self.counts["calls"] += 1
        try:
            result = await link.client.call_tool(name, arguments)
        except Exception as error:
            if not connection_lost(error):
                raise
            raise McpServerCrashed(self._lost(link)) from None
        text = result_text(result)
        if result.is_error:
            raise McpToolError(text or "the tool reported an error and no message")
        return text

    async def aclose(self) -> None:
        """Close the connection (a stdio server's process ends); a later call reconnects."""
        starting, link = self._starting, self._link
        self._starting = self._link = None
        if starting is not None:
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        if link is not None:
            await _stop(link)
        await asyncio.gather(*self._closing, return_exceptions=True)
        if self.counts["starts"]:
            log.info("MCP server `%s` closed: %s", self.spec.label, self.counts)

    async def __aenter__(self) -> McpServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _refusal(self) -> str | None:
        """Why the server is not started again (None: it may be)."""
        if not self._down or self.counts["restarts"] < self.spec.max_restarts:
            return None
        return (
            f"MCP server `{self.spec.label}` is down ({self.counts['crashes']} crash(es), "
            f"{self.counts['failed_starts']} failed start(s)) and is not restarted again "
            f"(max_restarts={self.spec.max_restarts})"
        )

    def _begin_start(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task[_Link]:
        if refusal := self._refusal():
            raise McpServerCrashed(refusal)
        self.counts["restarts"] += self._down
        self._starting = loop.create_task(self._open(), name=f"mcp start {self.spec.label}")
        self._starting.add_done_callback(_quiet)
        return self._starting

    async def _live(self) -> _Link:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (asyncio.run again): connect anew
            self._loop, self._link, self._starting = loop, None, None
        if self._link is not None:
            return self._link
        starting = self._starting or self._begin_start(loop)
        try:
            return await asyncio.shield(starting)  # a caller's timeout does not stop a start
        except McpServerError:
            if self._starting is starting:
                self._starting = None  # the next call tries again (within max_restarts)
            raise

    async def _open(self) -> _Link:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[mcp.Client] = loop.create_future()
        stop = asyncio.Event()
        # the server's stderr: it lives as long as the connection (closed by `_stop`)
        errlog = None if self.spec.url else tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115
        owner = loop.create_task(_own(self.spec, ready, stop, errlog), name=self.spec.label)
        link = _Link(ready, owner, stop, errlog)
        try:
            await ready
        except BaseException as error:
            if isinstance(error, McpServerError):
                self.counts["failed_starts"] += 1
                self._down = True
            await _stop(link)
            raise
        self.counts["starts"] += 1
        self._down = False
        self._link, self._starting = link, None
        return link

    def _lost(self, link: _Link) -> str:
        """Book a crash seen by a call on `link` (once per connection), start the restart,
        and say what happened."""
        if self._link is link:
            self._link, self._down = None, True
            self.counts["crashes"] += 1
            loop = asyncio.get_running_loop()
            closing = loop.create_task(_stop(link))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
            if self._starting is None and self._refusal() is None:
                self._begin_start(loop)
        then = (
            "it is restarted for the next call"
            if self._refusal() is None
            else f"it is not restarted again (max_restarts={self.spec.max_restarts})"
        )
        return (
            f"the MCP server `{self.spec.label}` closed the connection during the call "
            f"(crash {self.counts['crashes']} of this run; {then}){stderr_note(link.errlog)}"
        )


def _quiet(task: asyncio.Task[object]) -> None:
    """A background restart's failure is reported by the next call that awaits it."""
    if not task.cancelled():
        task.exception()


def client_for(spec: McpServerSpec, errlog: IO[str] | None) -> mcp.Client:
    import mcp
    import mcp.types

    if spec.url is not None:
        return mcp.Client(spec.url)
    params = mcp.StdioServerParameters(
        command=spec.argv[0], args=spec.argv[1:], env=dict(spec.env) or None, cwd=spec.cwd
    )
    # a text-mode TemporaryFile is a TextIOWrapper; typeshed calls it IO[str], mcp asks TextIO
    stderr = cast(TextIO, errlog) if errlog is not None else sys.stderr
    return mcp.Client(mcp.stdio_client(params, errlog=stderr))


async def _own(
    spec: McpServerSpec,
    ready: asyncio.Future[mcp.Client],
    stop: asyncio.Event,
    errlog: IO[str] | None,
) -> None:
    """Enter the client's context, hand the client over, hold it open until `stop`."""
    try:
        async with contextlib.AsyncExitStack() as stack:
            async with asyncio.timeout(spec.startup_timeout_s):
                client = await stack.enter_async_context(client_for(spec, errlog))
            ready.set_result(client)
            await stop.wait()
    except BaseException as error:
        if not ready.done():
            ready.set_exception(McpServerError(startup_error(spec, error, errlog)))
        if isinstance(error, asyncio.CancelledError):
            raise
        log.debug("MCP server `%s`: the connection ended: %s", spec.label, one_line(leaf(error)))


async def _stop(link: _Link) -> None:
    link.stop.set()
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await asyncio.gather(link.owner, return_exceptions=True)
    except TimeoutError:
        link.owner.cancel()
        await asyncio.gather(link.owner, return_exceptions=True)
    if link.errlog is not None:
        link.errlog.close()


async def list_tools(spec: McpServerSpec) -> list[mcp.types.Tool]:
    """Every tool the server lists (all pages), over a connection opened for it alone."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as errlog:
        async with contextlib.AsyncExitStack() as stack:
            try:
                async with asyncio.timeout(spec.startup_timeout_s):
                    client = await stack.enter_async_context(client_for(spec, errlog))
            except Exception as error:
                raise McpServerError(startup_error(spec, error, errlog)) from None
            tools, cursor = [], None
            try:
                async with asyncio.timeout(spec.startup_timeout_s):
                    while True:
                        page = await client.list_tools(cursor=cursor)
                        tools.extend(page.tools)
                        if not (cursor := page.next_cursor):
                            return tools
            except Exception as error:
                raise McpServerError(
                    f"MCP server `{spec.label}` started, but listing its tools failed: "
                    f"{one_line(leaf(error))}{stderr_note(errlog)}"
                ) from None


def servers_of(environments: Iterable[Environment | None]) -> list[McpServer]:
    """The MCP servers behind these environments' tools, each once."""
    found: dict[int, McpServer] = {}
    for env in environments:
        for tool in env.tools if env is not None else ():
            if isinstance(tool, McpTool):
                found.setdefault(id(tool.server), tool.server)
    return list(found.values())


async def start_servers(servers: Iterable[McpServer]) -> None:
    await asyncio.gather(*(s.start() for s in servers))


async def close_servers(servers: Iterable[McpServer]) -> None:
    await asyncio.gather(*(s.aclose() for s in servers), return_exceptions=True)


class McpEnvironment(McpServerSpec):
    """`[environment] name = "mcp"`'s params: the server, and the turns an episode may take."""

    max_turns: int = Field(default=4, ge=1)


def environment(**params: Any) -> Environment:
    """The tools of one MCP server; no environment turns (the model calls tools as it likes,
    then answers) and the scenario's `[reward]` scores the final reply."""
    config = McpEnvironment(**params)
    spec = McpServerSpec(**config.model_dump(exclude={"max_turns"}))
    return Environment(tools=McpServer.load(spec).tools, max_turns=config.max_turns)


__all__ = [
    "McpServer",
    "McpServerCrashed",
    "McpServerError",
    "McpServerSpec",
    "McpTool",
    "McpToolError",
    "close_servers",
    "environment",
    "result_text",
    "schema_problem",
    "servers_of",
    "start_servers",
]
