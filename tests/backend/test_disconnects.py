"""A client that goes away stops costing decode steps: its rows leave the batch at the engine's
next step, for an abandoned stream (engine and HTTP) and a non-streamed request alike."""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from art_rlvr.backend.engine.generation import SamplingParams

LONG = 200  # tokens a request would cost if nobody stopped it
SHORT = 64  # the same over HTTP (five clients: kept short for a loaded machine)


def engine_of(backend):
    return next(iter(backend._bases.values())).engine


async def settled(engine, timeout: float = 120) -> int:
    """The engine's completion-token count once its batch is gone and nothing waits."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        stats = engine.stats
        if stats.running_rows == 0 and engine._queue.empty() and not engine._pending:
            return stats.completion_tokens
        await asyncio.sleep(0.05)
    raise AssertionError("the engine kept generating")


async def test_a_closed_stream_frees_its_row_within_one_step(backend, model) -> None:
    engine = engine_of(backend)
    prompt = [1, 2, 3, 4]
    params = SamplingParams(max_tokens=LONG, temperature=1.0, seed=0, ignore_eos=True)
    cancelled = engine.stats.cancelled_requests
    events = engine.stream(prompt, params, adapter=None)
    for _ in range(4):
        await anext(events)
    at_close = engine.stats.completion_tokens
    await events.aclose()
    after = await settled(engine)
    assert engine.stats.cancelled_requests == cancelled + 1
    assert after - at_close <= 2, after - at_close  # the step in flight, at most one more


async def test_a_cancelled_generate_frees_its_rows(backend, model) -> None:
    engine = engine_of(backend)
    params = SamplingParams(max_tokens=LONG, temperature=1.0, seed=0, ignore_eos=True)
    before = engine.stats.completion_tokens
    task = asyncio.ensure_future(engine.generate([1, 2, 3], params, n=3, adapter=None))
    while engine.stats.completion_tokens - before < 6:
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    spent = await settled(engine) - before
    assert spent < LONG, spent  # three rows would have cost 600 tokens


async def stream_tokens(client: httpx.AsyncClient, body: dict, stop_after: int | None) -> int:
    """Chunks read from a streamed completion; with `stop_after`, the client hangs up then."""
    chunks = 0
    async with client.stream("POST", "/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunks += 1
                if stop_after is not None and chunks >= stop_after:
                    break  # leaving the block closes the connection
    return chunks


async def test_http_clients_that_hang_up_stop_generating(backend, model) -> None:
    """Four streamed and one plain request of 64 tokens; two streams hang up after 4 chunks
    and the plain one times out after a second: the engine generates for the rest only."""
    engine = engine_of(backend)
    body = {
        "model": model.get_inference_name(),
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": SHORT,
        "ignore_eos": True,
        "return_token_ids": True,
        "temperature": 1.0,
    }
    headers = {"Authorization": f"Bearer {model.inference_api_key}"}
    await settled(engine)
    before, cancelled = engine.stats.completion_tokens, engine.stats.cancelled_requests
    async with httpx.AsyncClient(
        base_url=model.inference_base_url, headers=headers, timeout=600
    ) as client:

        async def impatient() -> None:
            with contextlib.suppress(httpx.TimeoutException):
                await client.post("/chat/completions", json=body, timeout=1.0)

        counts = await asyncio.gather(
            *[
                stream_tokens(client, {**body, "stream": True, "seed": i}, stop)
                for i, stop in enumerate([4, 4, None, None])
            ],
            impatient(),
        )
    spent = await settled(engine) - before
    assert min(counts[2:4]) >= SHORT  # the survivors read every token
    assert engine.stats.cancelled_requests == cancelled + 3
    assert spent < 2 * SHORT + 3 * SHORT // 2, spent  # the survivors' 128, not 320
