"""The OpenAI-compatible HTTP face of TorchBackend: `/v1/chat/completions` and `/v1/models`.

It accepts what ART's `model.openai_client()` sends (`return_token_ids`, `nvext`,
`chat_template_kwargs`, ...) and answers in vLLM's shape (`prompt_token_ids` on the response,
`token_ids` per choice, logprobs as `token_id:<n>`), which is what `Trajectory.tokenize` and our
trainer read. It listens on 127.0.0.1 only, in its own thread with its own event loop, so a
caller that blocks its loop (a sync reflection call, a notebook cell) cannot stall generation.

Agents get what vLLM with ART's settings (`--enable-auto-tool-choice --tool-call-parser hermes`)
gives them: `tools` rendered into the prompt (`chat.render_ids`), Hermes `<tool_call>` blocks
parsed into `tool_calls` with `finish_reason="tool_calls"`; `tool_choice` `none` / `auto` /
`required` / a named function, the last two (and a JSON `response_format`) by constrained
decoding, so the call is well formed and its arguments match the schema; `stream=true` as
server-sent events whose deltas add up to the non-streamed reply, token ids on every chunk.
vLLM answers `required` with a JSON list instead of Hermes text; the API result is the same.
As there: `parallel_tool_calls=false` returns the first call only, a reply cut by the token
budget finishes with "length" (a call it cut short stays in the content as text), and
`top_logprobs` gives the most likely tokens of the distribution the logprob comes from.

Every completion returned is recorded in the route's `ServedLog` (backend/served.py), so that
the trainer can train the exact ids even when the client kept only the text.

One request cannot stall the others: a body over the size limit is a 413 before it is read
(or as soon as it passes the limit, without a Content-Length), a body that does not arrive
within `body_timeout_s` a 408; parsing and chat rendering run on a thread of the app's own
(`Renderer`), never on the event loop, and a prompt longer than the context could hold is a
400 before it is tokenized. A client gone mid-request is one log line. Connections are bounded
in `http_limits`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import jinja2
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from art_rlvr.backend.chat.render import parse_tool_calls, scan
from art_rlvr.backend.engine.generation import (
    Completion,
    ContextLengthError,
    EngineClosed,
    SamplingParams,
    TokenEvent,
)
from art_rlvr.backend.serving.chat_request import MAX_REQUEST_BYTES, ChatRequest
from art_rlvr.backend.serving.http_limits import (
    ConnectionLimits,
    guarded_protocol,
    quiet_accept_errors,
    raise_descriptor_limit,
)
from art_rlvr.backend.serving.served import ServedLog

log = logging.getLogger(__name__)


class ModelNotFound(LookupError):
    """The requested model name is not served here."""


Events = AsyncGenerator[TokenEvent | list[Completion], None]  # a streamed request, then its end


@dataclass(frozen=True)
class Route:
    """What a model name resolves to: rendering, generation (whole or streamed), decoding."""

    render: Callable[
        [list[dict[str, object]], list[dict[str, object]] | None, dict[str, object]], list[int]
    ]
    generate: Callable[[list[int], SamplingParams, int], Awaitable[list[Completion]]]
    stream: Callable[
        [list[int], SamplingParams, int], AsyncGenerator[TokenEvent | list[Completion], None]
    ]
    decode: Callable[[list[int]], str]
    decode_token: Callable[[int], str]
    served: ServedLog | None = None  # where what this route returns is recorded
    policy: str | None = None  # "name@step" of the exact adapter serving (None: a base model)
    # more characters of text than this cannot fit the context (`prompt_chars_bound`)
    max_prompt_chars: int | None = None


def prompt_chars_bound(max_context: int, longest_token_chars: int) -> int:
    """Characters of message text beyond which no rendering fits `max_context` tokens: a
    token stands for at most `longest_token_chars` characters of the text (a byte-level BPE
    vocabulary spells each byte as one character, and text has no fewer bytes than
    characters)."""
    return max_context * max(longest_token_chars, 1)


def text_chars(req: ChatRequest) -> int:
    """Characters of text in the request's messages and tools (a lower bound of what the
    prompt spells out)."""
    total = 0
    for message in req.messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
    return total


class BodyTooLarge(Exception):
    """The body passed the size limit while it was read."""


class Renderer:
    """The app's own thread for parsing and rendering requests (one: the tokenizer is not
    meant to be used by several threads at once, and the event loop never waits on it)."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="art-rlvr-render")

    async def run[T](self, work: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, work, *args)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def policy_spans(policy: str | None, prompt_len: int, completion_len: int) -> dict[str, object]:
    """ART's per-choice policy provenance (`policy_token_spans`, `prompt_policy_token_spans`):
    every token of a completion comes from one immutable step adapter, so one span covers it.
    ART's PipelineTrainer refuses an evaluation whose Choices lack them."""
    if policy is None or completion_len <= 0:
        return {}
    step = int(policy.rpartition("@")[2])
    span = {"generation_id": policy, "policy_version": step, "lora_slot": policy}
    span |= {"update_seq": step}
    prompt = [{"start_token": 1, "end_token": prompt_len, **span}] if prompt_len > 1 else []
    return {
        "prompt_policy_token_spans": prompt,
        "policy_token_spans": [{"start_token": 0, "end_token": completion_len, **span}],
    }


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body, read as it comes: BodyTooLarge past `limit` bytes, TimeoutError past
    `timeout_s`, ClientDisconnect when the client goes."""
    body = bytearray()
    async with asyncio.timeout(timeout_s):
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise BodyTooLarge
    return bytes(body)


def parse_request(body: bytes) -> ChatRequest | str:
    """The request, or a one-line reason it is not one (run on the renderer's thread)."""
    try:
        return ChatRequest.model_validate_json(body)
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        return f"{where}: {message}" if where else message


def build_app(
    *,
    resolve: Callable[[str], Route],
    list_models: Callable[[], list[str]],
    api_key: str,
    default_max_tokens: int = 256,
    max_request_bytes: int = MAX_REQUEST_BYTES,
    limits: ConnectionLimits | None = None,
) -> FastAPI:
    """The app; `app.state.renderer` is its thread, closed with `close_app`."""
    app = FastAPI(title="art_rlvr TorchBackend", docs_url=None, redoc_url=None)
    renderer = app.state.renderer = Renderer()
    body_timeout_s = (limits or ConnectionLimits()).body_timeout_s

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if request.headers.get("authorization", "") != f"Bearer {api_key}":
            return _error(401, "invalid or missing API key", "authentication_error")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_request_bytes:
            return _error(413, f"request body over {max_request_bytes} bytes")
        return await call_next(request)

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        now = int(time.time())
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": now, "owned_by": "art_rlvr"}
                for name in list_models()
            ],
        }

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> JSONResponse | StreamingResponse:
        try:
            body = await read_body(request, max_request_bytes, body_timeout_s)
        except BodyTooLarge:
            return _error(413, f"request body over {max_request_bytes} bytes")
        except TimeoutError:
            return _error(408, f"the request body did not arrive within {body_timeout_s:g} s")
        except ClientDisconnect:
            log.info("a client went away while sending a request: dropped it")
            return _error(499, "client closed the request")
        req = await renderer.run(parse_request, body)
        if isinstance(req, str):
            return _error(400, req)
        try:
            route = resolve(req.model)
            chars = text_chars(req)
            if route.max_prompt_chars is not None and chars > route.max_prompt_chars:
                raise ContextLengthError(
                    f"the messages hold {chars} characters, more than any prompt of the "
                    f"context length can spell out ({route.max_prompt_chars})"
                )
            prompt_ids = await renderer.run(
                route.render, req.messages, req.tool_dicts(), req.chat_template_kwargs or {}
            )
            sampling = req.sampling(default_max_tokens)
            if req.stream:
                events = route.stream(prompt_ids, sampling, req.n)
                first = await anext(events)
            else:
                completions = await _unless_disconnected(
                    request, route.generate(prompt_ids, sampling, req.n)
                )
        except ModelNotFound as error:
            return _error(404, str(error), "not_found_error")
        except ContextLengthError as error:
            return _error(400, str(error))
        except EngineClosed:  # the backend is closing (a run's Ctrl-C): an answer, no traceback
            return _error(503, "the server is shutting down", "server_error")
        except (ValueError, TypeError, KeyError, jinja2.TemplateError) as error:
            return _error(400, f"bad request: {error}")  # the model's template may raise too
        response_id = f"chatcmpl-{uuid.uuid4().hex}"
        if req.stream:
            return StreamingResponse(
                _sse(req, prompt_ids, first, events, route, response_id),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        if completions is None:  # nobody to answer; the engine dropped its rows
            return _error(499, "client closed the request")
        _record(route, req, response_id, prompt_ids, completions)
        return JSONResponse(_response(req, response_id, prompt_ids, completions, route))

    return app


async def _unless_disconnected(
    request: Request, work: Awaitable[list[Completion]]
) -> list[Completion] | None:
    """`work`'s result, or None once the client has gone (then `work` is cancelled, so the
    engine frees its rows at its next step, as a closed stream does)."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, watcher = asyncio.ensure_future(work), asyncio.ensure_future(gone())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    return task.result() if task in done else None


def _token_label(req: ChatRequest, decode_token: Callable[[int], str], token: int) -> str:
    return f"token_id:{token}" if req.return_tokens_as_token_ids else decode_token(token)


def _logprobs(
    req: ChatRequest,
    decode_token: Callable[[int], str],
    tokens: list[int],
    logprobs: list[float],
    tops: list[list[tuple[int, float]]] | None = None,
) -> dict[str, object]:
    def entry(token: int, logprob: float) -> dict[str, object]:
        label = _token_label(req, decode_token, token)
        return {"token": label, "logprob": logprob, "bytes": None}

    per_token = tops if tops is not None else [[] for _ in tokens]
    return {
        "content": [
            {**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top]}
            for t, lp, top in zip(tokens, logprobs, per_token, strict=True)
        ]
    }


def _message(req: ChatRequest, c: Completion) -> tuple[dict[str, object], str]:
    """The assistant message and finish reason: tool calls parsed out when tools are on (the
    first only without `parallel_tool_calls`); "length" whenever the budget cut the reply."""
    if not req.parses_tool_calls:
        return {"role": "assistant", "content": c.text}, c.finish_reason
    content, calls = parse_tool_calls(c.text)
    if not req.parallel_tool_calls:
        calls = calls[:1]
    message: dict[str, object] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    finish = c.finish_reason if c.finish_reason == "length" or not calls else "tool_calls"
    return message, finish


def _record(
    route: Route,
    req: ChatRequest,
    response_id: str,
    prompt_ids: list[int],
    completions: list[Completion],
) -> None:
    """Keep what was served, keyed by what any client keeps of it (`ServedLog`)."""
    if route.served is None:
        return
    replies = [_message(req, c)[0] for c in completions]
    route.served.add(
        req.messages,
        req.tool_dicts(),
        response_id,
        prompt_ids,
        [
            (message, c.token_ids, c.logprobs, c.finish_reason)
            for message, c in zip(replies, completions, strict=True)
        ],
    )


def _usage(prompt_ids: list[int], completions: list[Completion]) -> dict[str, int]:
    completion_tokens = sum(len(c.token_ids) for c in completions)
    return {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": completion_tokens,
        "total_tokens": len(prompt_ids) + completion_tokens,
    }


def _response(
    req: ChatRequest,
    response_id: str,
    prompt_ids: list[int],
    completions: list[Completion],
    route: Route,
) -> dict[str, object]:
    decode_token = route.decode_token
    choices = []
    for index, c in enumerate(completions):
        message, finish_reason = _message(req, c)
        choice: dict[str, object] = {
            "index": index,
            "message": message,
            "finish_reason": finish_reason,
            "logprobs": _logprobs(req, decode_token, c.token_ids, c.logprobs, c.top_logprobs)
            if req.logprobs
            else None,
        }
        if req.return_token_ids:
            choice["token_ids"] = c.token_ids
            choice |= policy_spans(route.policy, len(prompt_ids), len(c.token_ids))
        choices.append(choice)
    payload: dict[str, object] = {
        "id": response_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": choices,
        "usage": _usage(prompt_ids, completions),
    }
    if req.return_token_ids:
        payload["prompt_token_ids"] = prompt_ids
    return payload


@dataclass
class _ChoiceStream:
    """What one streamed choice has sent so far; turns growing text into deltas.

    Text that may still change is held back: a possible stop string's first characters, a
    partial UTF-8 character, and (with tools) an open or half-typed `<tool_call>` block. So the
    deltas add up to exactly the non-streamed message."""

    parse_tools: bool
    stops: list[str]
    max_calls: int | None = None  # 1 without parallel_tool_calls
    tokens: list[int] = field(default_factory=list)
    content: str = ""
    calls: int = 0

    def deltas(self, text: str, *, final: bool) -> list[dict[str, object]]:
        if not final:  # the engine cuts at a stop string only after reporting its token
            cut = min((text.find(s) for s in self.stops if s in text), default=len(text))
            holdback = max((len(s) for s in self.stops), default=1) - 1
            text = text[: min(cut, len(text) - holdback)].rstrip("\ufffd")
        content, calls = scan(text, final=final) if self.parse_tools else (text, [])
        calls = calls[: self.max_calls]
        out: list[dict[str, object]] = []
        if len(content) > len(self.content) and content.startswith(self.content):
            out.append({"content": content[len(self.content) :]})
            self.content = content
        for k, call in enumerate(calls[self.calls :], start=self.calls):
            function = call["function"]
            head = {"id": call["id"], "type": "function", "function": {"name": function["name"]}}
            out.append({"tool_calls": [{"index": k, **head}]})
            out.append(
                {"tool_calls": [{"index": k, "function": {"arguments": function["arguments"]}}]}
            )
        self.calls = len(calls)
        return out


async def _sse(
    req: ChatRequest,
    prompt_ids: list[int],
    first: TokenEvent | list[Completion],
    events: Events,
    route: Route,
    response_id: str,
) -> AsyncIterator[str]:
    """Server-sent events in the OpenAI chunk format, vLLM's token metadata on each chunk."""
    head = {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": req.model,
    }

    def chunk(choices: list[dict[str, object]], **extra: object) -> str:
        return f"data: {json.dumps({**head, 'choices': choices, **extra})}\n\n"

    stops = [s for s in ([req.stop] if isinstance(req.stop, str) else req.stop or []) if s]
    max_calls = None if req.parallel_tool_calls else 1
    streams = [_ChoiceStream(req.parses_tool_calls, stops, max_calls) for _ in range(req.n)]
    opening: list[dict[str, object]] = [
        {"index": i, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}
        for i in range(req.n)
    ]
    yield chunk(opening, **({"prompt_token_ids": prompt_ids} if req.return_token_ids else {}))
    try:
        item: TokenEvent | list[Completion] = first
        while True:
            if isinstance(item, list):
                for index, completion in enumerate(item):
                    for delta in streams[index].deltas(completion.text, final=True):
                        yield chunk([{"index": index, "delta": delta, "finish_reason": None}])
                    _, finish_reason = _message(req, completion)
                    last = {"index": index, "delta": {}, "finish_reason": finish_reason}
                    if req.return_token_ids:  # provenance of every token sent, at the end
                        sent = len(streams[index].tokens)
                        last |= policy_spans(route.policy, len(prompt_ids), sent)
                    yield chunk([last])
                if req.stream_options is not None and req.stream_options.include_usage:
                    yield chunk([], usage=_usage(prompt_ids, item))
                _record(route, req, response_id, prompt_ids, item)
                break
            stream = streams[item.index]
            stream.tokens.append(item.token_id)
            deltas = stream.deltas(route.decode(stream.tokens), final=False)
            choice: dict[str, object] = {"index": item.index, "finish_reason": None}
            if req.logprobs:
                choice["logprobs"] = _logprobs(
                    req, route.decode_token, [item.token_id], [item.logprob], [list(item.top)]
                )
            if req.return_token_ids:
                choice["token_ids"] = [item.token_id]
            if deltas or len(choice) > 2:
                yield chunk([{**choice, "delta": deltas[0] if deltas else {}}])
            for delta in deltas[1:]:
                yield chunk([{"index": item.index, "delta": delta, "finish_reason": None}])
            item = await anext(events)
    except (asyncio.CancelledError, GeneratorExit):
        raise
    except Exception as error:  # the stream has started: report in-band, as OpenAI does
        message = f"generation failed: {type(error).__name__}: {error}"
        yield f"data: {json.dumps({'error': {'message': message, 'type': 'server_error'}})}\n\n"
    finally:  # a client gone mid-stream: close the engine's stream, which frees its rows
        await events.aclose()
    yield "data: [DONE]\n\n"


IDLE_CONNECTION_SECONDS = 75
"""How long an idle keep-alive connection stays open (nginx's default). uvicorn's own 5 s equals
httpx's `keepalive_expiry` (the OpenAI SDK's transport), so a client could pick up a pooled
connection just as the server closed it and see `ReadError` on a busy machine; longer than
common clients' expiry (httpx 5 s, aiohttp 15 s), the client always retires it first."""


def server_config(app: FastAPI, limits: ConnectionLimits | None = None) -> uvicorn.Config:
    """uvicorn's settings for our apps: the guarded h11 protocol, keep-alive, a bounded
    graceful shutdown (in-flight requests get `graceful_shutdown_s`, then they are cut); the
    process's soft limit on open files lifted towards its hard one first."""
    raise_descriptor_limit()
    limits = limits or ConnectionLimits()
    return uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        http=guarded_protocol(limits),
        timeout_keep_alive=IDLE_CONNECTION_SECONDS,
        timeout_graceful_shutdown=limits.graceful_shutdown_s,
        backlog=limits.backlog,
    )


async def serve(server: uvicorn.Server, sockets: list[socket.socket]) -> None:
    """`server.serve`, with accept() failures logged as one line a second."""
    quiet_accept_errors(asyncio.get_running_loop())
    await server.serve(sockets=sockets)


def close_app(app: FastAPI) -> None:
    """Stop the app's renderer thread (after its server has stopped)."""
    app.state.renderer.close()


class ServerThread:
    """Runs uvicorn on 127.0.0.1 (ephemeral port) in a daemon thread with its own loop."""

    def __init__(
        self,
        app: FastAPI,
        *,
        host: Literal["127.0.0.1"] = "127.0.0.1",
        limits: ConnectionLimits | None = None,
    ) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        self.host, self.port = self._socket.getsockname()
        self._app = app
        self._server = uvicorn.Server(server_config(app, limits))
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="art-rlvr-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=30):
            raise RuntimeError("TorchBackend server did not start within 30 s")

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def open_connections(self) -> int:
        """Connections the server holds now (for tests and benchmarks)."""
        return len(self._server.server_state.connections)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)

        async def run() -> None:
            task = asyncio.create_task(serve(self._server, [self._socket]))
            while not self._server.started and not task.done():
                await asyncio.sleep(0.01)
            self._ready.set()
            await task

        try:
            loop.run_until_complete(run())
        finally:
            self._ready.set()
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._socket.close()
        close_app(self._app)
