"""Clients that hang up must not cost the ones that stay: streamed completions through
TorchBackend's server (real HTTP on loopback), in one process.

- `alone`: `n` streaming clients, each reading all `--tokens` forced tokens;
- `with quitters`: the same `n` clients, plus `n` more that hang up after 4 tokens;
- `with short ones`: the same `n` clients, plus `n` more that ask for 4 tokens and read them
  all: the same extra work (their prompts, 4 tokens each) with each row freed the moment its
  last token is sampled, the best an engine can do for a client that leaves after 4 tokens.

The figures are the survivors' throughput (their tokens / the time until the last of them is
done) with quitters over the same clients alone (1.0 only if the quitters' prompts and first
tokens cost nothing), and with quitters over with short ones: 1.0 when a row is freed as soon
as its client has gone (the engine's part). Settings alternate within each repeat; prints
median ratios.

    uv run python benchmarks/abandoned_streams.py [--clients 128] [--tokens 32] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time

import art
import httpx

from art_rlvr import DEFAULT_BASE_MODEL, TorchBackend

QUIT_AFTER = 4  # tokens a quitter reads before it hangs up


async def stream(client: httpx.AsyncClient, body: dict, stop_after: int | None) -> int:
    """Tokens read from one streamed completion (counted by the chunks' `token_ids`: a token
    may add no text yet, e.g. half a character); with `stop_after`, hang up then."""
    tokens = 0
    async with client.stream("POST", "/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line.removeprefix("data: "))
                tokens += sum(len(c.get("token_ids") or []) for c in chunk.get("choices", []))
                if stop_after is not None and tokens >= stop_after:
                    break  # leaving the block closes the connection
    return tokens


async def survivors_rate(
    client: httpx.AsyncClient, body: dict, n: int, quitters: int, *, hang_up: bool = True
) -> float:
    """The `n` survivors' tokens a second, `quitters` more clients beside them that hang up
    after `QUIT_AFTER` tokens (`hang_up`) or ask for only that many."""
    started = time.perf_counter()

    async def survivor(i: int) -> float:
        tokens = await stream(client, {**body, "seed": i}, None)
        assert tokens == body["max_tokens"], tokens  # every forced token arrived
        return time.perf_counter()

    short = body if hang_up else {**body, "max_tokens": QUIT_AFTER}
    stop_after = QUIT_AFTER if hang_up else None
    quits = [stream(client, {**short, "seed": n + i}, stop_after) for i in range(quitters)]
    done = await asyncio.gather(*[survivor(i) for i in range(n)], *quits)
    return n * body["max_tokens"] / (max(done[:n]) - started)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        backend = TorchBackend(path=tmp)
        model = art.TrainableModel(
            name="bench", project="bench", run_name="bench", base_model=DEFAULT_BASE_MODEL
        )
        await model.register(backend)
        body = {
            "model": model.get_inference_name(),
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": args.tokens,
            "ignore_eos": True,
            "temperature": 1.0,
            "stream": True,
            "return_token_ids": True,
        }
        headers = {"Authorization": f"Bearer {model.inference_api_key}"}
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        rates: dict[str, list[float]] = {"alone": [], "with quitters": [], "with short ones": []}
        async with httpx.AsyncClient(
            base_url=model.inference_base_url, headers=headers, timeout=1800, limits=limits
        ) as client:
            await survivors_rate(client, body, 8, 0)  # warm-up: connections, first batch
            for _ in range(args.repeats):
                rates["alone"].append(await survivors_rate(client, body, args.clients, 0))
                rates["with quitters"].append(
                    await survivors_rate(client, body, args.clients, args.clients)
                )
                rates["with short ones"].append(
                    await survivors_rate(client, body, args.clients, args.clients, hang_up=False)
                )
        engine = next(iter(backend._bases.values())).engine
        cancelled = engine.stats.cancelled_requests
        await backend.close()
    runs = list(zip(rates["alone"], rates["with quitters"], rates["with short ones"], strict=True))
    ratio = statistics.median(quit / alone for alone, quit, _ in runs)
    engine_ratio = statistics.median(quit / short for _, quit, short in runs)
    print(f"{args.clients} streaming clients x {args.tokens} tokens, median of {args.repeats}")
    for name, values in rates.items():
        print(f"  {name:>13}: survivors {statistics.median(values):6.1f} tok/s")
    print(
        f"with {args.clients} quitters (after {QUIT_AFTER} tokens) / alone: {ratio:.2f}; "
        f"{cancelled} requests cancelled; load average at the end: {os.getloadavg()[0]:.2f}"
    )
    print(f"with quitters / with clients that end after {QUIT_AFTER} tokens: {engine_ratio:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
