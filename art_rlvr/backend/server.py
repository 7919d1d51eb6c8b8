"""The OpenAI-compatible HTTP face of TorchBackend: `/v1/chat/completions` and `/v1/models`.

It accepts what ART's `model.openai_client()` sends (`return_token_ids`, `nvext`,
`chat_template_kwargs`, ...) and answers in vLLM's shape (`prompt_token_ids` on the response,
`token_ids` per choice, logprobs as `token_id:<n>`), which is what `Trajectory.tokenize` and our
trainer read. It listens on 127.0.0.1 only, in its own thread with its own event loop, so a
caller that blocks its loop (a sync reflection call, a notebook cell) cannot stall generation.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from art_rlvr.backend.engine import Completion, ContextLengthError, SamplingParams

MAX_REQUEST_BYTES = 4 * 1024 * 1024


class ChatRequest(BaseModel):
    """The subset of the chat-completions request we honour; unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    n: int = Field(default=1, ge=1, le=128)
    temperature: float | None = Field(default=None, ge=0.0, le=10.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=0)
    stream: bool = False
    tools: list[Any] | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, value: bool) -> bool:
        if value:
            raise ValueError("streaming is not supported by TorchBackend")
        return value

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("tool calling is not supported by TorchBackend")
        return value

    def sampling(self, default_max_tokens: int) -> SamplingParams:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=self.max_completion_tokens or self.max_tokens or default_max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            stop=tuple(s for s in stops if s),
            seed=self.seed,
            ignore_eos=self.ignore_eos,
        )


class ModelNotFound(LookupError):
    """The requested model name is not served here."""


@dataclass(frozen=True)
class Route:
    """What a model name resolves to: a tokenizer-aware generate function."""

    render: Callable[[list[dict[str, Any]], dict[str, Any]], list[int]]
    generate: Callable[[list[int], SamplingParams, int], Awaitable[list[Completion]]]
    decode_token: Callable[[int], str]


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


def build_app(
    *,
    resolve: Callable[[str], Route],
    list_models: Callable[[], list[str]],
    api_key: str,
    default_max_tokens: int = 256,
    max_request_bytes: int = MAX_REQUEST_BYTES,
) -> FastAPI:
    app = FastAPI(title="art_rlvr TorchBackend", docs_url=None, redoc_url=None)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if request.headers.get("authorization", "") != f"Bearer {api_key}":
            return _error(401, "invalid or missing API key", "authentication_error")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_request_bytes:
            return _error(413, f"request body over {max_request_bytes} bytes")
        return await call_next(request)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        now = int(time.time())
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": now, "owned_by": "art_rlvr"}
                for name in list_models()
            ],
        }

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.body()
        if len(body) > max_request_bytes:
            return _error(413, f"request body over {max_request_bytes} bytes")
        try:
            req = ChatRequest.model_validate_json(body)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return _error(400, f"{where}: {first['msg']}")
        try:
            route = resolve(req.model)
            prompt_ids = route.render(req.messages, req.chat_template_kwargs or {})
            completions = await route.generate(prompt_ids, req.sampling(default_max_tokens), req.n)
        except ModelNotFound as error:
            return _error(404, str(error), "not_found_error")
        except ContextLengthError as error:
            return _error(400, str(error))
        except (ValueError, TypeError, KeyError) as error:
            return _error(400, f"bad request: {error}")
        return JSONResponse(_response(req, prompt_ids, completions, route.decode_token))

    return app


def _response(
    req: ChatRequest,
    prompt_ids: list[int],
    completions: list[Completion],
    decode_token: Callable[[int], str],
) -> dict[str, Any]:
    def token_label(token: int) -> str:
        return f"token_id:{token}" if req.return_tokens_as_token_ids else decode_token(token)

    choices = []
    for index, c in enumerate(completions):
        choice: dict[str, Any] = {
            "index": index,
            "message": {"role": "assistant", "content": c.text},
            "finish_reason": c.finish_reason,
            "logprobs": (
                {
                    "content": [
                        {"token": token_label(t), "logprob": lp, "bytes": None, "top_logprobs": []}
                        for t, lp in zip(c.token_ids, c.logprobs, strict=True)
                    ]
                }
                if req.logprobs
                else None
            ),
        }
        if req.return_token_ids:
            choice["token_ids"] = c.token_ids
        choices.append(choice)
    completion_tokens = sum(len(c.token_ids) for c in completions)
    payload: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt_ids) + completion_tokens,
        },
    }
    if req.return_token_ids:
        payload["prompt_token_ids"] = prompt_ids
    return payload


class ServerThread:
    """Runs uvicorn on 127.0.0.1 (ephemeral port) in a daemon thread with its own loop."""

    def __init__(self, app: FastAPI, *, host: Literal["127.0.0.1"] = "127.0.0.1") -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        self.host, self.port = self._socket.getsockname()
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="art-rlvr-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=30):
            raise RuntimeError("TorchBackend server did not start within 30 s")

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)

        async def serve() -> None:
            task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
            while not self._server.started and not task.done():
                await asyncio.sleep(0.01)
            self._ready.set()
            await task

        try:
            loop.run_until_complete(serve())
        finally:
            self._ready.set()
            loop.close()

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._socket.close()


def new_api_key() -> str:
    return f"art-rlvr-{secrets.token_urlsafe(18)}"
