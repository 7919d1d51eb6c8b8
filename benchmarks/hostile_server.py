"""A normal request's latency while TorchBackend's server is under hostile use: 1,100 idle
connections (reopened as soon as the server closes one) and a 4 MB prompt sent again and again.

    uv run python benchmarks/hostile_server.py [--nofile 1024,1024:1024] [--requests 20]
        [--idle 1100] [--prompt-mb 4] [--out benchmarks/results/hostile_server]

The server is TorchBackend's own (the default model, one registered adapter) in a process of
its own on 127.0.0.1, started at each descriptor limit of `--nofile`: `1024` a soft 1024 under
this shell's hard limit (a shell's `ulimit -Sn 1024`, which the server lifts), `1024:1024`
soft and hard (a container's `ulimit -n 1024`, which it cannot); the row records the soft
limit the server ran at. This process holds the hostile clients (its own limit raised to fit
them). For each,
the median and p90 of `--requests` normal requests (a new connection each: `GET /v1/models`,
and a 1-token chat completion), idle and under attack, with and without a busy-loop process
on every core. The probe of main e6a4417 saw a normal request time out at 30 s under 1,100
idle connections, and a 3.9 MB prompt stall others 19.5-29.3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx

HOST = "127.0.0.1"
KEY = "bench-key"


def serve_forever() -> None:
    """(the server process) A TorchBackend with one model registered; prints its base URL and
    model name, then serves until stdin closes."""
    import asyncio

    import art

    from art_rlvr import DEFAULT_BASE_MODEL, TorchBackend

    async def main() -> None:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            backend = TorchBackend(path=tmp, seed=0)
            model = art.TrainableModel(
                name="bench", project="bench", run_name="bench", base_model=DEFAULT_BASE_MODEL
            )
            await model.register(backend)
            url, key = await backend._prepare_backend_for_training(model)
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)  # as the server lifted it
            reply = {"url": url, "key": key, "model": model.get_inference_name(), "soft": soft}
            print(json.dumps(reply))
            sys.stdout.flush()
            await asyncio.to_thread(sys.stdin.read)
            await backend.close()

    asyncio.run(main())


@contextmanager
def server(nofile: str) -> Iterator[dict[str, str]]:
    """The server process, started at `soft` or `soft:hard` open files."""

    def limit() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        soft, _, capped = nofile.partition(":")
        hard = min(hard, int(capped)) if capped else hard
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(int(soft), hard), hard))

    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
    )
    try:
        assert proc.stdout is not None
        yield json.loads(proc.stdout.readline())
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class IdleHolder:
    """`count` connections that never send a byte, each reopened once the server closes it."""

    def __init__(self, address: tuple[str, int], count: int) -> None:
        self.address, self.count = address, count
        self.reopened = 0
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> IdleHolder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _open(self, selector: selectors.BaseSelector) -> None:
        try:
            sock = socket.create_connection(self.address, timeout=5)
        except OSError:
            self.refused += 1
            return
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        for _ in range(self.count):
            self._open(selector)
        while not self._stop.is_set():
            for key, _ in selector.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:  # closed by the server: open another
                    selector.unregister(sock)
                    sock.close()
                    self.reopened += 1
                    self._open(selector)
            missing = self.count - len(selector.get_map())
            for _ in range(missing):
                self._open(selector)
        for key in list(selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]


class BigPrompts:
    """A `megabytes` MB prompt sent again and again (one at a time); the answers it got."""

    def __init__(self, base: dict[str, str], megabytes: float) -> None:
        chars = int(megabytes * 1_000_000)
        self.body = json.dumps(
            {"model": base["model"], "messages": [{"role": "user", "content": "x " * (chars // 2)}]}
        ).encode()
        self.base = base
        self.answers: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BigPrompts:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.base['key']}"}
        with httpx.Client(base_url=self.base["url"], headers=headers, timeout=120) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    status = client.post("/chat/completions", content=self.body).status_code
                except httpx.HTTPError:
                    status = 0
                self.answers.append((status, round(time.monotonic() - started, 3)))


@contextmanager
def busy_cores(on: bool) -> Iterator[None]:
    """A busy-loop process per core (on the same cores as the server), or nothing."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(len(os.sched_getaffinity(0)) if on else 0)
    ]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def normal_requests(base: dict[str, str], count: int) -> dict[str, dict[str, float]]:
    """Median and p90 seconds (and the worst) of `count` requests of each kind, a new
    connection each."""
    headers = {"Authorization": f"Bearer {base['key']}"}
    chat = {"model": base["model"], "messages": [{"role": "user", "content": "Hi."}],
            "max_tokens": 1}  # fmt: skip
    seconds: dict[str, list[float]] = {"models": [], "chat": []}
    failures = 0
    for _ in range(count):
        for kind in seconds:
            limits = httpx.Limits(max_keepalive_connections=0)
            with httpx.Client(headers=headers, timeout=60, limits=limits) as client:
                started = time.monotonic()
                try:
                    if kind == "models":
                        response = client.get(base["url"] + "/models")
                    else:
                        response = client.post(base["url"] + "/chat/completions", json=chat)
                    ok = response.status_code == 200
                except httpx.HTTPError:
                    ok = False
                seconds[kind].append(time.monotonic() - started if ok else 60.0)
                failures += not ok
        time.sleep(0.1)
    out: dict[str, dict[str, float]] = {
        kind: {
            "median_s": round(statistics.median(s), 4),
            "p90_s": round(statistics.quantiles(s, n=10)[-1], 4),
            "max_s": round(max(s), 4),
        }
        for kind, s in seconds.items()
    }
    out["failed"] = {"requests": float(failures)}
    return out


def measure(args: argparse.Namespace, nofile: str) -> list[dict]:
    rows = []
    with server(nofile) as base:
        address = (HOST, int(base["url"].split(":")[2].split("/")[0]))
        normal_requests(base, 3)  # warm
        for load in (False, True):
            for hostile in (False, True):
                with busy_cores(load):
                    if not hostile:
                        row = {"latency": normal_requests(base, args.requests)}
                    else:
                        with (
                            IdleHolder(address, args.idle) as idle,
                            BigPrompts(base, args.prompt_mb) as big,
                        ):
                            time.sleep(2)  # the connections are open, a big prompt is in
                            row = {"latency": normal_requests(base, args.requests)}
                        statuses = sorted({s for s, _ in big.answers})
                        row |= {
                            "idle_reopened": idle.reopened,
                            "idle_refused": idle.refused,
                            "big_prompts": len(big.answers),
                            "big_prompt_statuses": statuses,
                            "big_prompt_median_s": statistics.median(s for _, s in big.answers)
                            if big.answers
                            else None,
                        }
                row |= {"started_nofile": nofile, "server_nofile": base["soft"]}
                row |= {"hostile": hostile, "busy_loop": load}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nofile", default="1024,1024:1024", help="soft[:hard],...")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--idle", type=int, default=1100)
    parser.add_argument("--prompt-mb", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/hostile_server"))
    args = parser.parse_args()
    if args.serve:
        serve_forever()
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # this process holds the clients
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * args.idle + 256)), hard))
    rows = [row for n in args.nofile.split(",") for row in measure(args, n)]
    now = datetime.now(UTC)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{now:%Y-%m-%dT%H%M}.json"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    path.write_text(
        json.dumps(
            {
                "date": f"{now:%Y-%m-%d %H:%M} UTC",
                "commit": commit.stdout.strip(),
                "cores": len(os.sched_getaffinity(0)),
                "idle": args.idle,
                "prompt_mb": args.prompt_mb,
                "requests": args.requests,
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
