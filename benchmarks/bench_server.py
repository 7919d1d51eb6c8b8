"""A fast OpenAI-compatible chat server for benchmarks, in its own process so its CPU is not
charged to the client being measured.

    with serving(latency=0.0, replies={"bench": "42"}) as base_url: ...

It answers every `/v1/chat/completions` after `latency` seconds with a fixed completion per
requested model name (one token, with logprobs, as vLLM shapes them); a request whose last
message contains a key of `triggers` gets that reply instead. aiohttp rather than our own
server: its C parser keeps the server from being what is measured.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def completion(text: str, model: str) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "logprobs": {
                        "content": [
                            {
                                "token": "token_id:3100",
                                "logprob": -0.5,
                                "bytes": list(text[:4].encode()),
                                "top_logprobs": [],
                            }
                        ]
                    },
                }
            ],
            "usage": {"prompt_tokens": 30, "completion_tokens": 1, "total_tokens": 31},
        }
    ).encode()


def main(spec: dict) -> None:
    from aiohttp import web

    latency: float = spec["latency"]
    bodies = {model: completion(text, model) for model, text in spec["replies"].items()}
    triggers = {key: completion(text, "trigger") for key, text in spec["triggers"].items()}
    fallback = next(iter(bodies.values()))

    async def chat(request: web.Request) -> web.Response:
        raw = await request.read()
        body = fallback
        if triggers or len(bodies) > 1:
            payload = json.loads(raw)
            body = bodies.get(payload.get("model"), fallback)
            last = str(payload["messages"][-1].get("content", ""))
            body = next((b for key, b in triggers.items() if key in last), body)
        if latency:
            await asyncio.sleep(latency)
        return web.Response(body=body, content_type="application/json")

    async def run() -> None:
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        print(site._server.sockets[0].getsockname()[1], flush=True)  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(run())


@contextmanager
def serving(
    latency: float = 0.0, replies: dict[str, str] | None = None, triggers: dict | None = None
) -> Iterator[str]:
    """Start the server process; yield its base URL; stop it."""
    spec = {"latency": latency, "replies": replies or {"bench": "42"}, "triggers": triggers or {}}
    proc = subprocess.Popen(
        [sys.executable, __file__, json.dumps(spec)], stdout=subprocess.PIPE, text=True
    )
    try:
        port = proc.stdout.readline().strip() if proc.stdout else ""
        if not port.isdigit():
            raise RuntimeError("the benchmark server did not start")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
