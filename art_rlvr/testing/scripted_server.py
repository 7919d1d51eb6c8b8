"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1, for tests.

Each POST to `/v1/chat/completions` consumes the next `Step` of a script: a reply (optionally
with tool calls), an HTTP error (with an optional Retry-After), a delay long enough to trip a
client timeout, a connection reset, malformed JSON, empty content or a truncated reply. Every
request is recorded, so a test can check what a client sent (retries, the reflection prompt)
and what it never sent (a key in a log).

It is built on the standard library's threading HTTP server rather than FastAPI: a connection
reset needs the raw socket, which an ASGI app never sees.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import art

Action = Literal["reply", "error", "reset", "malformed", "empty", "truncated"]


class ScriptedCall(BaseModel):
    """A tool call in a scripted reply; `arguments` is sent as given, so it may be bad JSON."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    arguments: str = "{}"


class Step(BaseModel):
    """One scripted answer; build them with the class methods, which read like the script."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: Action = "reply"
    text: str | None = ""  # None: a null `content`, as some servers send for "nothing"
    status: int = Field(default=200, ge=100, le=599)
    retry_after: float | None = Field(default=None, ge=0)
    delay_s: float = Field(default=0.0, ge=0)
    tool_calls: tuple[ScriptedCall, ...] = ()

    @classmethod
    def calls(cls, *calls: tuple[str, str | dict[str, object]], text: str | None = None) -> Step:
        """A reply whose message calls tools (finish_reason "tool_calls"): each call is
        (name, arguments), a dict sent as JSON or a string sent as is."""
        return cls(
            action="reply",
            text=text,
            tool_calls=tuple(
                ScriptedCall(name=n, arguments=a if isinstance(a, str) else json.dumps(a))
                for n, a in calls
            ),
        )

    @classmethod
    def reply(cls, text: str | None, *, delay_s: float = 0.0) -> Step:
        return cls(action="reply", text=text, delay_s=delay_s)

    @classmethod
    def error(cls, status: int, *, retry_after: float | None = None, text: str = "") -> Step:
        return cls(action="error", status=status, retry_after=retry_after, text=text)

    @classmethod
    def timeout(cls, delay_s: float) -> Step:
        """Answer only after `delay_s`: a client with a shorter timeout gives up first."""
        return cls(action="reply", text="(too late)", delay_s=delay_s)

    @classmethod
    def reset(cls) -> Step:
        return cls(action="reset")

    @classmethod
    def malformed(cls) -> Step:
        return cls(action="malformed")

    @classmethod
    def empty(cls) -> Step:
        return cls(action="empty")

    @classmethod
    def truncated(cls, text: str) -> Step:
        """`text` sent as is with finish_reason "length", as a model that ran out of tokens."""
        return cls(action="truncated", text=text)


@dataclass(frozen=True)
class Recorded:
    """One request as the server saw it."""

    index: int
    step: int | None
    path: str
    headers: dict[str, str]
    body: dict[str, object] | None
    at: float

    @property
    def messages(self) -> list[dict[str, object]]:
        messages = (self.body or {}).get("messages", [])
        return list(messages) if isinstance(messages, list) else []

    @property
    def last_user_text(self) -> str:
        users = [m for m in self.messages if m.get("role") == "user"]
        content = users[-1].get("content", "") if users else ""
        return content if isinstance(content, str) else json.dumps(content)


@dataclass
class _Script:
    steps: list[Step]
    default: Step | None
    replay_identical: bool
    lock: threading.Lock = field(default_factory=threading.Lock)
    position: int = 0
    seen: dict[str, int] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)

    def take(
        self, path: str, headers: dict[str, str], body: dict[str, object] | None
    ) -> Step | None:
        """The step for this request (None: the script is exhausted), recorded under the lock."""
        with self.lock:
            key = json.dumps((body or {}).get("messages"), sort_keys=True)
            index: int | None
            if self.replay_identical and key in self.seen:
                index = self.seen[key]
            elif self.position < len(self.steps):
                index = self.position
                self.position += 1
                self.seen[key] = index
            else:
                index = None
            self.requests.append(
                Recorded(len(self.requests), index, path, headers, body, time.monotonic())
            )
            if index is None:
                return self.default
            return self.steps[index]


def completion_payload(
    text: str | None,
    model: str,
    finish_reason: str = "stop",
    tool_calls: tuple[ScriptedCall, ...] = (),
) -> dict[str, object]:
    words = len((text or "").split())
    message: dict[str, object] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in tool_calls
        ]
        finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason,
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": words, "total_tokens": 1 + words},
    }


def _handler(script: _Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            return

        def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                data = {"object": "list", "data": [{"id": "scripted", "object": "model"}]}
                self._send(200, json.dumps(data).encode())
            else:
                self._send(404, b'{"error": {"message": "not found"}}')

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                body = None
            headers = {k.lower(): v for k, v in self.headers.items()}
            if not self.path.rstrip("/").endswith("/chat/completions"):
                script.requests.append(
                    Recorded(len(script.requests), None, self.path, headers, body, time.monotonic())
                )
                self._send(404, b'{"error": {"message": "not found"}}')
                return
            step = script.take(self.path, headers, body)
            model = str((body or {}).get("model", "scripted"))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._answer(step, model)  # (a client that timed out is no longer listening)

        def _answer(self, step: Step | None, model: str) -> None:
            if step is None:
                message = {"error": {"message": "scripted server: script exhausted"}}
                self._send(400, json.dumps(message).encode())
                return
            if step.delay_s:
                time.sleep(step.delay_s)
            if step.action == "reset":
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.connection.close()
                self.close_connection = True
                return
            if step.action == "error":
                headers = (
                    {} if step.retry_after is None else {"Retry-After": f"{step.retry_after:g}"}
                )
                text = step.text or f"scripted error {step.status}"
                error = {"error": {"message": text, "type": "scripted", "code": step.status}}
                self._send(step.status, json.dumps(error).encode(), headers)
                return
            if step.action == "malformed":
                self._send(200, b'{"id": "chatcmpl-x", "choices": [{"message": {"content": "unte')
                return
            if step.action == "empty":
                self._send(200, json.dumps(completion_payload("", model)).encode())
                return
            finish = "length" if step.action == "truncated" else "stop"
            payload = completion_payload(step.text, model, finish, step.tool_calls)
            self._send(200, json.dumps(payload).encode())

    return Handler


class _Server(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5: a burst of concurrent clients would see
    # dropped SYNs and one-second connect retries, which is not what a test should measure
    request_queue_size = 256


class ScriptedServer:
    """`with ScriptedServer([Step.reply("..."), ...]) as server:` then point a client at
    `server.base_url`. With `replay_identical`, a request whose messages were seen before gets
    the same step again instead of the next one (a resumed run asking its question again)."""

    def __init__(
        self,
        steps: list[Step],
        *,
        default: Step | None = None,
        replay_identical: bool = False,
    ) -> None:
        self._script = _Script(list(steps), default, replay_identical)
        self._server = _Server(("127.0.0.1", 0), _handler(self._script))
        self._server.daemon_threads = True
        self.host, self.port = self._server.socket.getsockname()[:2]  # = server_address
        self._thread = threading.Thread(
            # a short poll: `close` waits one poll interval (0.5 s by default) per server
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="scripted-llm",
            daemon=True,
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def role(self, key_env: str, **settings: Any) -> dict[str, object]:
        """A reflection LM's or teacher's settings pointing at this server (its key read from
        `key_env`, which the caller sets)."""
        return {"model": "openai/scripted", "api_base": self.base_url, "api_key_env": key_env,
                "timeout_s": 5.0, **settings}  # fmt: skip

    @property
    def requests(self) -> list[Recorded]:
        with self._script.lock:
            return list(self._script.requests)

    @property
    def chat_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.rstrip("/").endswith("/chat/completions")]

    @property
    def steps_used(self) -> int:
        with self._script.lock:
            return self._script.position

    @property
    def exhausted(self) -> bool:
        with self._script.lock:
            return self._script.position >= len(self._script.steps)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def scripted_model(server: ScriptedServer, name: str = "episodes") -> art.Model:
    """An `art.Model` whose inference endpoint is the scripted server: what a rollout talks to
    when the test writes the replies (ART imported here, not at module load)."""
    import art

    return art.Model(
        name=name,
        project="t",
        inference_base_url=server.base_url,
        inference_api_key="k",
        inference_model_name="scripted",
    )


__all__ = [
    "Recorded",
    "ScriptedCall",
    "ScriptedServer",
    "Step",
    "completion_payload",
    "scripted_model",
]
