"""A recording Weave trace server on 127.0.0.1, for tests.

Weave has no local trace server, and its hosted one is out of reach in tests. This server
answers just enough of the trace-server and W&B endpoints that `weave.init` and op tracing use
(server info, project check, call batches, object/table/file creation, the viewer query), and
records every request. Point weave at it with `WF_TRACE_SERVER_URL` and `WANDB_BASE_URL`.
"""

from __future__ import annotations

import email.message
import gzip
import hashlib
import json
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class TraceRequest:
    method: str
    path: str
    body: object


def _digest(body: object) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _reply(path: str, body: Any) -> object:  # JSON a test client sent
    """A plausible answer for each endpoint weave calls; `{}` for the rest."""
    path = path.split("?")[0].rstrip("/")
    if path.endswith("/server_info"):
        return {
            "min_required_weave_python_version": "0.0.1",
            "trace_server_version": "99.0.0",
        }
    if path.endswith("/graphql"):
        variables = (body or {}).get("variables") or {}
        name = variables.get("name", "project")
        return {
            "data": {
                "viewer": {"username": "tester", "defaultEntity": {"name": "tester"}},
                "project": {"name": name},
                "upsertModel": {"model": {"name": name}},
            }
        }
    if path.endswith("/call/start"):
        start = body.get("start", {}) if isinstance(body, dict) else {}
        return {"id": start.get("id") or str(uuid.uuid4()), "trace_id": start.get("trace_id")}
    if path.endswith("/obj/create") or path.endswith("/file/create"):
        return {"digest": _digest(body)}
    if path.endswith("/table/create"):
        rows = (body or {}).get("table", {}).get("rows", []) if isinstance(body, dict) else []
        return {"digest": _digest(body), "row_digests": [_digest(r) for r in rows]}
    if path.endswith("/table/update"):
        return {"digest": _digest(body), "updated_row_digests": []}
    if path.endswith("/ensure_project_exists"):
        return {"project_name": (body or {}).get("project_name", "p")}
    return {}


def op_short_name(op_name: str) -> str:
    """`weave:///ent/proj/op/rollout:abc123` -> `rollout`."""
    return op_name.rsplit("/", 1)[-1].split(":", 1)[0]


def _decode(raw: bytes, headers: email.message.Message) -> object:
    if headers.get("Content-Encoding") == "gzip":
        raw = gzip.decompress(raw)
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"_raw_bytes": len(raw)}


class RecordingTraceServer:
    """Start on a free loopback port; `requests` is everything received, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[TraceRequest] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # quiet
                return

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = _decode(self.rfile.read(length) if length else b"", self.headers)
                with recorder._lock:
                    recorder._requests.append(TraceRequest(method, self.path, body))
                payload = json.dumps(_reply(self.path, body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.socket.getsockname()[:2]  # what server_address holds
        return f"http://{host}:{port}"

    @property
    def requests(self) -> list[TraceRequest]:
        with self._lock:
            return list(self._requests)

    def calls(self) -> list[dict[str, object]]:
        """Every traced call (op name, inputs, output, parent), whichever way weave sent it:
        complete-call batches (weave 0.54) or start/end records merged by call id."""
        complete: list[dict[str, object]] = []
        starts: dict[str, dict[str, object]] = {}
        ends: dict[str, dict[str, object]] = {}
        for request in self.requests:
            body = request.body if isinstance(request.body, dict) else {}
            if request.path.endswith("/calls/complete"):
                complete.extend(body.get("batch", []))
            elif request.path.endswith("/call/start"):
                start = body.get("start", {})
                starts[start.get("id")] = start
            elif request.path.endswith("/call/end"):
                end = body.get("end", {})
                ends[end.get("id")] = end
            elif request.path.endswith("/call/upsert_batch"):
                for item in body.get("batch", []):
                    req = item.get("req", {})
                    if item.get("mode") == "start":
                        starts[req["start"]["id"]] = req["start"]
                    elif item.get("mode") == "end":
                        ends[req["end"]["id"]] = req["end"]
        merged = [{**start, **(ends.get(call_id) or {})} for call_id, start in starts.items()]
        calls = complete + merged
        return [{**call, "name": op_short_name(str(call.get("op_name", "")))} for call in calls]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> RecordingTraceServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
