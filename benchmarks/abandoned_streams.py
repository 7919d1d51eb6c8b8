"""Clients that hang up must not cost the ones that stay: streamed completions through
TorchBackend's server (real HTTP on loopback), in one process.

- `alone`: `n` streaming clients, each reading all `--tokens` forced tokens;
- `with quitters`: the same `n` clients, plus `n` more that hang up after 4 tokens;
- `with short ones`: the same `n` clients, plus `n` more that ask for 4 tokens and read them
  all: the same extra work (their prompts, 4 tokens each) with each row freed the moment its
  last token is sampled, the best an engine can do for a client that leaves after 4 tokens.

The figures are the survivors' throughput (their tokens / the time until the last of them is
done) with quitters over the same clients alone, and with quitters over with short ones: 1.0
when a row is freed as soon as its client has gone (the engine's part). The engine also counts
the tokens it sampled for the extra clients: 4.0 a quitter means none after its hang-up.

With more clients than the engine's rows (64 by default), every row-step a quitter takes is
one a survivor waits for, so with quitters / alone cannot pass n*T / (n*T + n*4) (0.89 at the
defaults) even if a row were freed the instant its client left; the script prints that bound.
With `--rows` at least twice `--clients` every client has a row from the start and the bound
does not apply.
Settings alternate within each repeat; prints median ratios.

    uv run python benchmarks/abandoned_streams.py [--clients 128] [--tokens 32] [--repeats 2]
        [--rows 64]
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
from art_rlvr.backend.engine.generation import GenerationEngine

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
    client: httpx.AsyncClient,
    engine: GenerationEngine,
    body: dict,
    n: int,
    quitters: int,
    *,
    hang_up: bool = True,
) -> tuple[float, float]:
    """The `n` survivors' tokens a second, `quitters` more clients beside them that hang up
    after `QUIT_AFTER` tokens (`hang_up`) or ask for only that many; and the tokens the engine
    sampled for each of those (0.0 without them)."""
    sampled = engine.stats.completion_tokens
    started = time.perf_counter()

    async def survivor(i: int) -> float:
        tokens = await stream(client, {**body, "seed": i}, None)
        assert tokens == body["max_tokens"], tokens  # every forced token arrived
        return time.perf_counter()

    short = body if hang_up else {**body, "max_tokens": QUIT_AFTER}
    stop_after = QUIT_AFTER if hang_up else None
    quits = [stream(client, {**short, "seed": n + i}, stop_after) for i in range(quitters)]
    done = await asyncio.gather(*[survivor(i) for i in range(n)], *quits)
    rate = n * body["max_tokens"] / (max(done[:n]) - started)
    while engine.stats.running_rows or engine._pending:  # the last dropped rows
        await asyncio.sleep(0.05)
    extra = engine.stats.completion_tokens - sampled - n * body["max_tokens"]
    return rate, extra / quitters if quitters else 0.0


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rows", type=int, default=64, help="the engine's max batch rows")
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        backend = TorchBackend(path=tmp, max_batch_rows=args.rows)
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
        engine = next(iter(backend._bases.values())).engine
        settings = {"alone": (0, True), "with quitters": (args.clients, True)}
        settings["with short ones"] = (args.clients, False)
        rates: dict[str, list[float]] = {name: [] for name in settings}
        sampled: dict[str, list[float]] = {name: [] for name in settings}
        async with httpx.AsyncClient(
            base_url=model.inference_base_url, headers=headers, timeout=1800, limits=limits
        ) as client:
            await survivors_rate(client, engine, body, 8, 0)  # warm-up: connections, first batch
            for _ in range(args.repeats):
                for name, (quitters, hang_up) in settings.items():
                    rate, each = await survivors_rate(
                        client, engine, body, args.clients, quitters, hang_up=hang_up
                    )
                    rates[name].append(rate)
                    sampled[name].append(each)
        cancelled = engine.stats.cancelled_requests
        rows = engine.max_batch_rows
        await backend.close()
    runs = list(zip(rates["alone"], rates["with quitters"], rates["with short ones"], strict=True))
    ratio = statistics.median(quit / alone for alone, quit, _ in runs)
    engine_ratio = statistics.median(quit / short for _, quit, short in runs)
    print(f"{args.clients} streaming clients x {args.tokens} tokens, median of {args.repeats}")
    for name, values in rates.items():
        extra = f", {max(sampled[name]):.2f} tokens sampled for each extra client at most"
        print(
            f"  {name:>15}: survivors {statistics.median(values):6.1f} tok/s{extra * (name != 'alone')}"
        )
    survivors = args.clients * args.tokens
    bound = survivors / (survivors + args.clients * QUIT_AFTER)
    crowded = 2 * args.clients > rows
    print(
        f"with {args.clients} quitters (after {QUIT_AFTER} tokens) / alone: {ratio:.2f}"
        + (f" (at most {bound:.2f}: more clients than the engine's {rows} rows)" * crowded)
        + f"; {cancelled} requests cancelled; load average at the end: {os.getloadavg()[0]:.2f}"
    )
    print(f"with quitters / with clients that end after {QUIT_AFTER} tokens: {engine_ratio:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
