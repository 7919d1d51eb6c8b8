"""`python -m art_rlvr.backend.external.skyrl`: SkyRL's Tinker-API engine on this machine, so that
`backend=tinker` runs without a Tinker account (on CPU here; on your GPUs SkyRL trains with
FSDP or Megatron behind the same API).

SkyRL 0.4.0 runs in its own uv environment (`skyrl_env/`, synced on first use into the
cache): its pins (tinker SDK < 0.26, transformers <= 5.16.1) cannot share art_rlvr's lock. The
engine serves one base model; the embedded model is served under its own name
(`embedded:SmolLM2-135M-Instruct`) from the folder TorchBackend converts it into.

Two wire differences between skyrl 0.4.0 and the clients ART's tinker extra brings are bridged
in a loopback proxy in front of SkyRL's API, without editing anything installed:

- the tinker SDK (>= 0.26) requires every `/api/v1/asample` promise to carry one
  `sample_sequence_ids` entry per requested sample, which skyrl 0.4.0 does not send: the proxy
  adds ids made from the promise's request id;
- ART resumes from `tinker://<run>/<checkpoint_id>` as the checkpoint list names it, and
  SkyRL lists a training checkpoint's id without the `weights/` its own paths (and its loader)
  require: the proxy lists it as its `tinker_path` names it, `weights/step_000001`.

(One more seen, skyrl generating past `<|im_end|>` when a request
names no stop tokens, does not arise: ART's TinkerNativeBackend and tinker-cookbook send the
renderer's stop tokens with every request.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from art_rlvr.backend.adapters.model_source import (
    DEFAULT_BASE_MODEL,
    cache_root,
    resolve_base_model,
)

if TYPE_CHECKING:
    from filelock import FileLock
    from starlette.applications import Starlette

ENV_PROJECT = Path(__file__).with_name("skyrl_env")
SKYRL_VERSION = "0.4.0"
HOST = "127.0.0.1"
READY_LINE = "Starting background engine..."  # the engine's own line once its model is loaded
LOCAL_KEY = "tml-local"  # the SDK wants a key of Tinker's shape; SkyRL checks none
SAMPLE_PATH = "/api/v1/asample"
CHECKPOINT_LISTS = re.compile(r"^/api/v1/(training_runs|models)/[^/]+/checkpoints$")


class EngineError(RuntimeError):
    """The engine could not start or stopped; the message is one line with what to do."""


class SkyRLSettings(BaseModel):
    """One engine: the model it serves, where it listens and keeps its state, its batch shapes
    (fixed shapes spare JAX's recompiles, a few seconds to a minute each on CPU)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_model: str = DEFAULT_BASE_MODEL
    weights: Path | None = Field(
        default=None, description="a Hugging Face folder to load instead of base_model's"
    )
    port: int = Field(default=8765, ge=0, le=65535, description="0: any free port")
    state_dir: Path | None = Field(
        default=None, description="database and checkpoints; default: the cache's skyrl/state"
    )
    # one per training client: a run holds one while it runs, and SkyRL frees it only when the
    # client's session expires (`session_timeout_s` after its last heartbeat)
    max_lora_adapters: int = Field(default=16, ge=2)
    max_lora_rank: int = Field(default=32, ge=1)
    train_micro_batch_size: int = Field(default=1, ge=1)
    sample_max_num_sequences: int = Field(default=8, ge=1)
    session_timeout_s: int = Field(default=900, ge=60)
    start_timeout_s: float = Field(default=1800.0, gt=0)


def state_dir(settings: SkyRLSettings) -> Path:
    return settings.state_dir or cache_root() / "skyrl" / "state"


def environment_dir() -> Path:
    """The engine's venv: one per skyrl version, in the cache, shared by every state dir."""
    return cache_root() / "skyrl" / f"venv-{SKYRL_VERSION}"


def find_uv() -> str:
    """The uv executable: the one running us (`uv run` sets UV), the `uv` package's (a
    dependency), else one on PATH that runs (pyenv's shims may not)."""
    import uv

    candidates = [os.environ.get("UV"), uv.find_uv_bin(), shutil.which("uv")]
    for found in [c for c in candidates if c]:
        done = subprocess.run([found, "--version"], capture_output=True, check=False)
        if done.returncode == 0:
            return found
    raise EngineError("SkyRL's engine runs under uv, and no uv here runs: pip install uv")


def weights_folder(settings: SkyRLSettings) -> str | None:
    """The folder SkyRL loads, when it is not base_model's own (the embedded model's)."""
    if settings.weights is not None:
        return str(settings.weights.resolve())
    if settings.base_model.startswith("embedded:"):
        return resolve_base_model(settings.base_model)
    return None


def backend_config(settings: SkyRLSettings) -> dict[str, int]:
    return {
        "max_lora_adapters": settings.max_lora_adapters,
        "max_lora_rank": settings.max_lora_rank,
        "train_micro_batch_size": settings.train_micro_batch_size,
        "sample_max_num_sequences": settings.sample_max_num_sequences,
    }


def uv_flags() -> list[str]:
    """`uv run` flags SkyRL's API process passes on when it starts its engine."""
    return ["--project", str(ENV_PROJECT), "--locked", "--extra", "tinker", "--extra", "jax"]


def api_command(
    settings: SkyRLSettings, uv: str, port: int, weights: str | None, state: Path
) -> list[str]:
    """SkyRL's API server, as its engine launch expects to find it (`uv run ... -m
    skyrl.tinker.api`): the JAX backend, SQLite state and checkpoints under `state`."""
    command = [uv, "run", *uv_flags(), "-m", "skyrl.tinker.api", "--host", HOST]
    command += ["--port", str(port), "--base-model", settings.base_model, "--backend", "jax"]
    command += ["--backend-config", json.dumps(backend_config(settings))]
    command += ["--database-url", f"sqlite:///{state / 'tinker.db'}"]
    command += ["--checkpoints-base", str(state / "checkpoints")]
    command += ["--external-inference-lora-base", str(state / "lora_models")]
    command += ["--session-timeout-sec", str(settings.session_timeout_s)]
    if weights is not None:
        command += ["--base-model-checkpoint-path", weights]
    return command


def child_environment(uv: str, offline: bool) -> dict[str, str]:
    """The engine's environment: its own venv, uv on PATH (the API starts the engine with a
    bare `uv`), JAX on CPU with a persistent compile cache, log lines unwrapped."""
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(environment_dir())}
    env.setdefault("UV_PYTHON", base_python())  # ours is a 3.12, as SkyRL's project asks
    env["UV_PYTHON_DOWNLOADS"] = "never"  # a missing Python is an error, not a download
    env["PATH"] = os.pathsep.join([str(Path(uv).parent), env.get("PATH", "")])
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache_root() / "skyrl" / "jax-cache"))
    env["COLUMNS"] = "10000"  # rich wraps SkyRL's log lines at the terminal's width otherwise
    env.pop("VIRTUAL_ENV", None)  # ours, not the engine's
    if offline:
        env["HF_HUB_OFFLINE"] = "1"  # the weights are a local folder: never ask the hub
    return env


def base_python() -> str:
    """The interpreter this venv was made from (uv makes the engine's venv from it too)."""
    return str(getattr(sys, "_base_executable", None) or sys.executable)


def sync_environment(uv: str, log: Path) -> float:
    """`uv sync` of the engine's environment (a no-op once done); seconds taken."""
    started = time.monotonic()
    env = child_environment(uv, offline=False)
    with log.open("ab") as out:
        done = subprocess.run(
            [uv, "sync", *uv_flags()], env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if done.returncode != 0:
        raise EngineError(
            f"installing SkyRL {SKYRL_VERSION} into {environment_dir()} failed "
            f"(exit {done.returncode}): {last_lines(log)}"
        )
    return time.monotonic() - started


def last_lines(path: Path, count: int = 3) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    return " | ".join([line for line in lines if line][-count:])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Whether uvicorn could listen there (it sets SO_REUSEADDR: TIME_WAIT does not count)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


# --- the compatibility proxy ---------------------------------------------------------------

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}


def with_sequence_ids(promise: bytes, request: bytes) -> bytes:
    """An asample promise as the tinker SDK >= 0.26 reads it: one id per requested sample,
    made from the promise's request id. A promise that carries ids is left as it is."""
    body = json.loads(promise)
    if body.get("sample_sequence_ids") is None:
        count = int(json.loads(request or b"{}").get("num_samples") or 1)
        body["sample_sequence_ids"] = [f"{body['request_id']}-{i}" for i in range(count)]
    return json.dumps(body).encode()


def with_weights_ids(listing: bytes) -> bytes:
    """A checkpoint list whose training checkpoints' ids are the tail of their own
    `tinker_path` (`weights/step_000001`), the form SkyRL's loader takes back."""
    body = json.loads(listing)
    for checkpoint in body.get("checkpoints", []):
        path, name = checkpoint.get("tinker_path") or "", checkpoint.get("checkpoint_id") or ""
        if checkpoint.get("checkpoint_type") == "training" and path.endswith(f"/weights/{name}"):
            checkpoint["checkpoint_id"] = f"weights/{name}"
    return json.dumps(body).encode()


def compat_app(upstream: str) -> Starlette:
    """An ASGI app that forwards every request to SkyRL's API at `upstream`, bridging the two
    differences above; SkyRL not answering is a 503 that says so."""
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    # No pool limit: every sample waits on a long-polled `retrieve_future`, and a bounded pool
    # would hold the session heartbeats behind them until the session expires.
    client = httpx.AsyncClient(
        base_url=upstream,
        timeout=httpx.Timeout(900.0, connect=10.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
    )

    async def forward(request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        if request.headers.get("content-encoding"):
            headers["content-encoding"] = request.headers["content-encoding"]
        try:
            answer = await client.request(
                request.method,
                request.url.path,
                params=request.query_params,
                content=body,
                headers=headers,
            )
        except httpx.TransportError as error:
            detail = f"SkyRL's API at {upstream} is not answering ({type(error).__name__})"
            return JSONResponse({"detail": detail}, status_code=503)
        content = answer.content
        if answer.status_code == 200 and request.url.path == SAMPLE_PATH:
            content = with_sequence_ids(content, body)
        elif answer.status_code == 200 and CHECKPOINT_LISTS.match(request.url.path):
            content = with_weights_ids(content)
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_HEADERS}
        return Response(content, status_code=answer.status_code, headers=kept)

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
    app = Starlette(routes=[Route("/{path:path}", forward, methods=methods)])
    app.state.client = client
    return app


# --- one running engine ----------------------------------------------------------------------


class ProxyThread:
    """The proxy's uvicorn on a thread and event loop of its own: the tinker SDK blocks its
    caller's thread while it fetches its client config (`InternalClientHolder`), so a proxy
    served from the caller's loop would never answer it (tinker-cookbook's `rl.train.main`
    timed out that way)."""

    def __init__(self, app: Starlette, port: int) -> None:
        import uvicorn

        config = uvicorn.Config(app, host=HOST, port=port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="skyrl-proxy", daemon=True)
        self.thread.start()

    async def started(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise EngineError(f"the proxy did not start on {HOST}:{self.server.config.port}")
            await asyncio.sleep(0.05)

    async def stop(self, timeout_s: float) -> None:
        self.server.should_exit = True
        await asyncio.to_thread(self.thread.join, timeout_s)


@dataclass
class RunningEngine:
    """SkyRL's API (and, through it, its engine) in its own process group, and the proxy
    serving it on `base_url`; `stop()` ends both."""

    settings: SkyRLSettings
    base_url: str
    log_path: Path
    process: subprocess.Popen[bytes]
    proxy: ProxyThread
    lock: FileLock
    started_s: float = 0.0
    _stopped: bool = field(default=False, repr=False)

    def environment(self) -> dict[str, str]:
        """What a client (ART's TinkerNativeBackend, tinker-cookbook) needs to reach it; the
        SDK's telemetry, which SkyRL only swallows, off."""
        return {
            "TINKER_BASE_URL": self.base_url,
            "TINKER_API_KEY": LOCAL_KEY,
            "TINKER_TELEMETRY": "0",
        }

    def alive(self) -> bool:
        return self.process.poll() is None

    async def stop(self, timeout_s: float = 20.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        await stop_group(self.process, timeout_s)
        await self.proxy.stop(timeout_s)
        self.lock.release()


async def stop_group(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM to the engine's process group (the API lets its engine go), then SIGKILL."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while process.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await asyncio.to_thread(process.wait)


async def wait_ready(
    process: subprocess.Popen[bytes], log: Path, timeout_s: float, offset: int
) -> None:
    """Until the engine logs, past byte `offset` of its log (this start's lines), that its
    model is loaded; its exit or the timeout is an error."""
    deadline = time.monotonic() + timeout_s
    while True:
        with log.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
        if READY_LINE.encode() in data:
            return
        offset += max(0, len(data) - len(READY_LINE))
        if process.poll() is not None:
            raise EngineError(
                f"SkyRL's API exited with code {process.returncode} before its engine was ready; "
                f"log {log}: {last_lines(log)}"
            )
        if time.monotonic() > deadline:
            raise EngineError(f"SkyRL's engine was not ready after {timeout_s:.0f} s; log {log}")
        await asyncio.sleep(0.5)


def take_lock(state: Path) -> FileLock:
    from filelock import FileLock, Timeout

    lock = FileLock(str(state / "engine.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise EngineError(
            f"another SkyRL engine keeps its state in {state}; stop it, or pass --state-dir"
        ) from None
    return lock


async def start(settings: SkyRLSettings, *, log: Path | None = None) -> RunningEngine:
    """Sync the engine's environment, start SkyRL's API on a private port and the proxy on
    `settings.port`, and return once the engine has loaded its model."""
    started = time.monotonic()
    state = state_dir(settings)
    state.mkdir(parents=True, exist_ok=True)
    port = settings.port or free_port()
    if not port_is_free(port):
        raise EngineError(f"{HOST}:{port} is in use (another engine?); pass --port")
    lock = take_lock(state)
    log = log or state / "engine.log"
    try:
        uv = find_uv()
        weights = weights_folder(settings)
        sync_environment(uv, log)
        command = api_command(settings, uv, free_port(), weights, state)
        offset = log.stat().st_size
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                cwd=state,
                env=child_environment(uv, offline=weights is not None),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
    except BaseException:
        lock.release()
        raise
    upstream = f"http://{HOST}:{command[command.index('--port') + 1]}"
    proxy = ProxyThread(compat_app(upstream), port)
    engine = RunningEngine(settings, f"http://{HOST}:{port}", log, process, proxy, lock)
    try:
        await proxy.started()
        await wait_ready(process, log, settings.start_timeout_s, offset)
    except BaseException:
        await engine.stop()
        raise
    engine.started_s = time.monotonic() - started
    return engine


@contextlib.asynccontextmanager
async def running(
    settings: SkyRLSettings, *, log: Path | None = None
) -> AsyncIterator[RunningEngine]:
    engine = await start(settings, log=log)
    try:
        yield engine
    finally:
        await engine.stop()


# --- the command line ------------------------------------------------------------------------


def parse(argv: list[str]) -> SkyRLSettings:
    parser = argparse.ArgumentParser(
        prog="python -m art_rlvr.backend.external.skyrl",
        description="SkyRL's Tinker-API engine on 127.0.0.1, for backend=tinker.",
    )
    parser.add_argument("--base-model", default=DEFAULT_BASE_MODEL)
    parser.add_argument("--weights", type=Path, help="a HF folder to load for --base-model")
    parser.add_argument("--port", type=int, default=8765, help="0: any free port")
    parser.add_argument("--state-dir", type=Path, help="database and checkpoints")
    parser.add_argument("--max-lora-rank", type=int, default=32)
    parser.add_argument("--max-lora-adapters", type=int, default=16)
    parser.add_argument("--sample-max-num-sequences", type=int, default=8)
    args = parser.parse_args(argv)
    return SkyRLSettings(
        base_model=args.base_model,
        weights=args.weights,
        port=args.port,
        state_dir=args.state_dir,
        max_lora_rank=args.max_lora_rank,
        max_lora_adapters=args.max_lora_adapters,
        sample_max_num_sequences=args.sample_max_num_sequences,
    )


def ready_message(engine: RunningEngine) -> str:
    env = " ".join(f"{k}={v}" for k, v in engine.environment().items())
    return "\n".join(
        [
            f"SkyRL {SKYRL_VERSION} engine ready in {engine.started_s:.0f} s: "
            f"{engine.settings.base_model} at {engine.base_url} (log {engine.log_path})",
            f"  export {env}",
            "  then, in this checkout: UV_PROJECT_ENVIRONMENT=.venv-tinker uv run --locked "
            "--extra tinker --no-dev python -m art_rlvr.run backend=tinker scenario=arith",
            "Ctrl-C stops it.",
        ]
    )


async def serve(settings: SkyRLSettings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    print(f"starting SkyRL {SKYRL_VERSION} for {settings.base_model} ...", flush=True)
    async with running(settings) as engine:
        print(ready_message(engine), flush=True)
        while not stop.is_set() and engine.alive():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
        if not engine.alive():
            print(
                f"SkyRL's engine exited (code {engine.process.returncode}); "
                f"log {engine.log_path}: {last_lines(engine.log_path)}",
                file=sys.stderr,
            )
            return 1
    print("stopped", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    settings = parse(sys.argv[1:] if argv is None else argv)
    try:
        return asyncio.run(serve(settings))
    except EngineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
