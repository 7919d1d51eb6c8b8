"""Weave traces with no W&B key or server: weave's own write-ahead log, filled now, sent later.

weave 0.54 can persist every request it would send (calls, objects, tables, files) in a
write-ahead log (its `enable_wal` setting) and send that log from another process (its
`wal_sender`). What it cannot do is start without a trace server: `weave.init` asks one for
its version and the user's name. `record_offline` answers those two questions from a stand-in
on 127.0.0.1 for the length of `weave.init`, with weave's sender off, so every call of the run
lands in `~/.weave/wal/<entity>/<project>/<id>/` and nothing leaves the machine (weave's PyPI
version check included: during `weave.init` HTTPS goes to the stand-in, which refuses it).
`upload` sends the log to the real trace server with the user's key; the command is
`python -m art_rlvr.observe.upload entity/project`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

log = logging.getLogger(__name__)

# names the log's folder (weave files a log under a digest of the key that wrote it); it is
# shown to the stand-in only, never sent anywhere else
OFFLINE_KEY = "art-rlvr-offline-traces"
UPLOAD_HINT = "python -m art_rlvr.observe.upload {project}"


def offline_log_dir(project: str) -> Path:
    """Where `record_offline(project)` makes weave write its log."""
    from weave.durability.wal_client_id import WAL_ROOT, compute_client_id

    entity, name = project.split("/")
    return Path(WAL_ROOT) / entity / name / compute_client_id(OFFLINE_KEY)


def _get(value: object, key: str, default: object = None) -> object:
    """`value[key]` of a JSON object, else `default` (also for anything but an object)."""
    return value.get(key, default) if isinstance(value, dict) else default


def _handshake(path: str, body: object, entity: str) -> dict[str, object]:
    """The stand-in's answers: the trace server's version, the W&B viewer and project."""
    if path.endswith("/server_info"):
        return {"min_required_weave_python_version": "0.0.1", "trace_server_version": "99.0.0"}
    if path.endswith("/graphql"):  # the viewer, and the project (found or "created")
        name = _get(_get(body, "variables"), "name", "")
        viewer = {"username": "offline", "defaultEntity": {"name": entity}}
        project = {"name": name}
        return {"data": {"viewer": viewer, "project": project, "upsertModel": {"model": project}}}
    if path.endswith("/ensure_project_exists"):
        return {"project_name": _get(body, "project_name", "")}
    return {}


@contextlib.contextmanager
def stand_in(entity: str) -> Iterator[str]:
    """A loopback HTTP server that answers weave.init's handshake; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"null")
            except (json.JSONDecodeError, UnicodeDecodeError):
                body = None
            payload = json.dumps(_handshake(self.path.split("?")[0], body, entity)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="weave-stand-in", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for a block, then put back what was there."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def record_offline(project: str) -> bool:
    """Start weave writing this process's traces to its on-disk log; True when on."""
    if project.count("/") != 1:
        log.warning(
            "weave tracing: off: offline traces need weave_project=entity/project "
            "(the W&B entity they will be uploaded to)"
        )
        return False
    import weave

    entity = project.split("/")[0]
    settings = {"print_call_link": False, "enable_wal": True, "disable_wal_sender": True}
    with stand_in(entity) as url:
        # the stand-in answers weave.init; HTTPS (weave's PyPI version check) is sent to it as
        # a proxy, which refuses: nothing leaves the machine. All of it only while init runs.
        variables = {"WF_TRACE_SERVER_URL": f"{url}/traces", "WANDB_BASE_URL": url}
        variables |= {"WANDB_API_KEY": OFFLINE_KEY, "HTTPS_PROXY": url, "https_proxy": url}
        weave_log = logging.getLogger("weave")
        level = weave_log.level
        weave_log.setLevel(logging.WARNING)  # its "logged in as ... view at <stand-in>" lines
        with environment(variables):
            try:
                weave.init(project, settings=settings)
            except Exception as error:  # weave's own errors vary by version
                log.warning("weave tracing: off: offline weave.init(%r) failed: %s", project, error)
                return False
            finally:
                weave_log.setLevel(level)
    log.info(
        "weave tracing: offline, project %s, recording to %s; upload later with: %s",
        project,
        offline_log_dir(project),
        UPLOAD_HINT.format(project=project),
    )
    return True


def pending_records(folder: Path) -> int:
    """Records in a log folder not yet sent (a fully sent file is deleted by the sender)."""
    if not folder.is_dir():
        return 0
    return sum(len(p.read_text().splitlines()) for p in folder.glob("*.jsonl"))


def upload(project: str, *, trace_server_url: str, api_key: str) -> tuple[int, int]:
    """Send `project`'s offline log to the trace server: (records sent, records left).

    Weave's own sender does the work (the requests it would have made online, replayed in
    order); a record it cannot send stays in the folder, so a failed upload can be rerun."""
    from weave.durability.wal_sender import create_sender
    from weave.trace_server_bindings.remote_http_trace_server import RemoteHTTPTraceServer

    folder = offline_log_dir(project)
    if not pending_records(folder):
        return 0, 0
    server = RemoteHTTPTraceServer(trace_server_url, password=api_key)
    server.ensure_project_exists(*project.split("/"))
    sender = create_sender(str(folder), server)
    sent = sender.drain_once()
    return sent, pending_records(folder)
