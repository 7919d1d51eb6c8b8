"""Rollouts/s through art_rlvr's rollout + ART's gather vs a bare AsyncOpenAI + asyncio.gather loop.

    uv run python benchmarks/framework_overhead.py [--repeats 5] [--quick]

Both sides send the same request (an arith scenario's messages, logprobs on) to the same
instant-reply OpenAI-compatible server, which runs in its own process so that its CPU is not
charged to the client, and both use ART's HTTP connection limits, so the only difference is the
framework: ART's client proxy, scoring with the scenario's reward, building `art.Trajectory` /
`TrajectoryGroup`, and `art.gather_trajectory_groups` with its progress bar.

At each concurrency C the sides run in turns (A B A B ...); a turn is one gather of N
rollouts (groups of min(C, 8)) with at most C requests in flight: `gather_groups(...,
max_in_flight=C)` for art_rlvr, an `asyncio.Semaphore(C)` around each request otherwise. A
third side, "ART alone", is the same rollout written directly against ART (its client,
`art.Trajectory`, its group and gather, no reward), which splits the cost between ART and
art_rlvr. Each turn gets a fresh client. Prints, per C, the medians of the per-repeat ratios
(goal: art_rlvr / bare >= 0.95), rollouts/s and the client's CPU per rollout of each side.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import art
from bench_server import serving
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from art_rlvr import load_scenario
from art_rlvr.rollouts.rollout import gather_groups
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.scenarios.scenario import Example


def http_client() -> DefaultAsyncHttpxClient:
    """The limits ART's `model.openai_client()` uses, so neither side queues on connections."""
    from openai import DEFAULT_CONNECTION_LIMITS, DEFAULT_TIMEOUT

    return DefaultAsyncHttpxClient(
        timeout=type(DEFAULT_TIMEOUT)(timeout=120, connect=5.0),
        limits=type(DEFAULT_CONNECTION_LIMITS)(
            max_connections=100_000, max_keepalive_connections=100_000
        ),
    )


Side = Callable[[list[Example]], Awaitable[int]]


def art_side(url: str, group_size: int, concurrency: int) -> tuple[Side, AsyncOpenAI]:
    """A fresh `art.Model` (so a fresh connection pool) and its run function."""
    model = art.Model(
        name="bench", project="bench", inference_base_url=url, inference_api_key="bench",
        inference_model_name="bench",
    )  # fmt: skip

    async def run(examples: list[Example]) -> int:
        groups = await gather_groups(
            model, examples, group_size, sampling=SamplingConfig(), description="art_rlvr",
            max_in_flight=concurrency,
        )  # fmt: skip
        return sum(len(g.trajectories) for g in groups)

    return run, model.openai_client()


def art_only_side(url: str, group_size: int, concurrency: int) -> tuple[Side, AsyncOpenAI]:
    """What a rollout written directly against ART costs: ART's client, a Trajectory with a
    constant reward, ART's group and gather; the gap to art_rlvr is art_rlvr's own layer."""
    model = art.Model(
        name="bench", project="bench", inference_base_url=url, inference_api_key="bench",
        inference_model_name="bench",
    )  # fmt: skip
    sampling = SamplingConfig()

    async def one(example: Example, limiter: asyncio.Semaphore) -> art.Trajectory:
        messages = example.messages()
        async with limiter:
            response = await model.openai_client().chat.completions.create(
                model="bench", messages=messages, max_tokens=sampling.max_tokens,
                temperature=sampling.temperature, top_p=sampling.top_p, logprobs=True,
            )  # fmt: skip
        return art.Trajectory(messages_and_choices=[*messages, response.choices[0]], reward=0.0)

    async def run(examples: list[Example]) -> int:
        limiter = asyncio.Semaphore(concurrency)
        groups = await art.gather_trajectory_groups(
            (
                art.trajectory_group([one(sc, limiter) for _ in range(group_size)])
                for sc in examples
            ),
            pbar_desc="art only",
        )
        return sum(len(g.trajectories) for g in groups)

    return run, model.openai_client()


def bare_side(url: str, group_size: int, concurrency: int) -> tuple[Side, AsyncOpenAI]:
    client = AsyncOpenAI(base_url=url, api_key="bench", http_client=http_client())
    sampling = SamplingConfig()

    async def one(example: Example, limiter: asyncio.Semaphore) -> str:
        async with limiter:
            response = await client.chat.completions.create(
                model="bench", messages=example.messages(), max_tokens=sampling.max_tokens,
                temperature=sampling.temperature, top_p=sampling.top_p, logprobs=True,
            )  # fmt: skip
        return response.choices[0].message.content or ""

    async def run(examples: list[Example]) -> int:
        limiter = asyncio.Semaphore(concurrency)
        texts = await asyncio.gather(
            *[one(sc, limiter) for sc in examples for _ in range(group_size)]
        )
        return len(texts)

    return run, client


async def turn(side: Side, examples: list[Example]) -> tuple[float, float]:
    """(rollouts/s wall, client CPU ms per rollout) for one gather over the scenarios."""
    wall, cpu = time.perf_counter(), time.process_time()
    n = await side(examples)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return n / wall, 1000 * cpu / n


async def measure(url: str, concurrency: int, rollouts: int, repeats: int) -> str:
    scenario = load_scenario("arith", seed=0)
    pool = [*scenario.splits["train"]]
    group_size = min(concurrency, 8)
    examples = [pool[i % len(pool)] for i in range(rollouts // group_size)]
    makers = {"art_rlvr": art_side, "art_only": art_only_side, "bare": bare_side}
    warm_up = examples[: max(1, concurrency // group_size)]
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in makers}
    for r in range(repeats):
        names = list(makers)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            # a fresh client per turn: httpx's pool slows as it grows, and must not favour
            # whichever side ran second
            side, client = makers[name](url, group_size, concurrency)
            await turn(side, warm_up)  # open up to C connections, outside the timing
            results[name].append(await turn(side, examples))
            await client.close()

    def ratio(a: str, b: str) -> float:
        """Median of the per-repeat ratios (each pair measured close together)."""
        return statistics.median(x[0] / y[0] for x, y in zip(results[a], results[b], strict=True))

    rate = {name: statistics.median(r[0] for r in rs) for name, rs in results.items()}
    cpu = {name: statistics.median(r[1] for r in rs) for name, rs in results.items()}
    return (
        f"concurrency {concurrency:4d}: art_rlvr / bare {ratio('art_rlvr', 'bare'):.2f} "
        f"(goal >= 0.95), art_rlvr / ART alone {ratio('art_rlvr', 'art_only'):.2f}, "
        f"ART alone / bare {ratio('art_only', 'bare'):.2f}; rollouts/s "
        f"{rate['art_rlvr']:.0f} / {rate['art_only']:.0f} / {rate['bare']:.0f}; client CPU per "
        f"rollout {cpu['art_rlvr']:.2f} / {cpu['art_only']:.2f} / {cpu['bare']:.2f} ms"
    )


async def main(repeats: int, quick: bool) -> None:
    with serving() as url:
        for concurrency in (1, 64, 512):
            rollouts = 256 if quick else 1024
            print(await measure(url, concurrency, rollouts, repeats), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer rollouts, 1 repeat (smoke)")
    args = parser.parse_args()
    asyncio.run(main(1 if args.quick else args.repeats, args.quick))
