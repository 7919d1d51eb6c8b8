"""Rewards off the event loop: rollouts/s through art_rlvr with the math reward (math-verify in
its worker pool) and with the code reward (a sandboxed subprocess per check), each versus the
same rollouts with a trivial reward, against the same OpenAI-compatible server on loopback.

    uv run python benchmarks/reward_loop.py [--latency 0.25] [--in-flight 16] [--repeats 3]
                                            [--quick]

The server (its own process) answers each request after `--latency` seconds, standing in for
generation, with `--in-flight` requests open at once; so the ratio says whether scoring overlaps
generation (the reward runs off the event loop) or stalls it. Goal >= 0.9. Both rewards get a
realistic wrong answer (math: a boxed fraction math-verify must parse and compare; code: a
function body the sandbox must run against the tests), so every check does its full work.

Then the pathological answer: one rollout in a batch answers `\\boxed{9^{9^{9^{9}}}}` (sympy
would expand ~3.7e8 digits). Prints the other rollouts' latency (median, max) next to the same
batch without it, and the pathological one's, which the reward's timeout bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time

import art
from bench_server import serving

from art_rlvr import load_scenario
from art_rlvr.core.types import Score
from art_rlvr.rollouts.rollout import gather_groups, rollout
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.scenarios.rewards.code import sandbox_unavailable_reason
from art_rlvr.scenarios.rewards.math import MathReward, verifier_pool
from art_rlvr.scenarios.scenario import Example, Scenario

REPLIES = {
    "math": "Adding the parts gives $\\boxed{\\frac{7}{3}}$.",
    "humaneval": "    return None\n",
}
PATHOLOGICAL = "\\boxed{9^{9^{9^{9}}}}"
MARKER = "<<pathological>>"


def trivial(x: dict, y: str) -> Score:
    return Score(reward=float(bool(y)), feedback="non-empty")


def with_reward(scenario: Scenario, reward) -> Scenario:
    """The same records and prompts, scored by another reward."""
    copy = dataclasses.replace(scenario, reward=reward, splits={})
    for name, split in scenario.splits.items():
        copy.splits[name] = [dataclasses.replace(sc, scenario=copy) for sc in split]
    return copy


def model_for(url: str, name: str) -> art.Model:
    return art.Model(
        name=name, project="bench", inference_base_url=url, inference_api_key="bench",
        inference_model_name=name,
    )  # fmt: skip


async def rate(model: art.Model, examples: list[Example], in_flight: int) -> float:
    started = time.perf_counter()
    groups = await gather_groups(
        model, examples, 4, sampling=SamplingConfig(), max_in_flight=in_flight,
        description=model.name,
    )  # fmt: skip
    n = sum(len(g.trajectories) for g in groups)
    assert n == 4 * len(examples)
    return n / (time.perf_counter() - started)


async def ratio_line(url: str, name: str, n: int, in_flight: int, repeats: int) -> str:
    real = load_scenario(name, seed=0)
    fake = with_reward(real, trivial)
    pool = [*real.splits["train"], *real.splits["val"], *real.splits["test"]]
    ids = [sc.id for sc in pool][: n // 4]
    sides = {
        "real": [sc for sc in pool if sc.id in ids],
        "trivial": [sc for split in fake.splits.values() for sc in split if sc.id in ids],
    }
    model = model_for(url, name)
    await rate(model, sides["real"][:4], in_flight)  # warm up: sandbox, pool, connections
    rates: dict[str, list[float]] = {side: [] for side in sides}
    for r in range(repeats):
        for side in list(sides) if r % 2 == 0 else list(reversed(sides)):
            rates[side].append(await rate(model, sides[side], in_flight))
    ratios = [a / b for a, b in zip(rates["real"], rates["trivial"], strict=True)]
    label = "math-verify pool" if name == "math" else "sandbox"
    return (
        f"{name:9s} ({label}): {statistics.median(rates['real']):6.1f} rollouts/s vs trivial "
        f"reward {statistics.median(rates['trivial']):6.1f}: ratio "
        f"{statistics.median(ratios):.2f} (goal >= 0.9)"
    )


async def latencies(model: art.Model, examples: list[Example]) -> list[float]:
    async def timed(sc: Example) -> float:
        started = time.perf_counter()
        await rollout(model, sc)
        return time.perf_counter() - started

    return await asyncio.gather(*[timed(sc) for sc in examples])


async def pathological_line(url: str, n: int) -> str:
    scenario = load_scenario("math", seed=0)
    reward = scenario.reward
    timeout = reward.timeout_s if isinstance(reward, MathReward) else float("nan")
    ordinary = scenario.splits["val"][:n]
    base = ordinary[0]
    bad = dataclasses.replace(base, id="pathological", x={**base.x, "problem": MARKER})
    model = model_for(url, "math")
    clean = await latencies(model, ordinary)
    mixed = await latencies(model, [bad, *ordinary])
    others = mixed[1:]
    return (
        f"pathological answer among {n} rollouts: others' latency median {statistics.median(others):.2f} s, "
        f"max {max(others):.2f} s (without it: {statistics.median(clean):.2f} s, "
        f"{max(clean):.2f} s); the pathological rollout {mixed[0]:.2f} s "
        f"(reward timeout {timeout:.0f} s, scored 0)"
    )


async def main(latency: float, in_flight: int, repeats: int, quick: bool) -> None:
    await verifier_pool(MathReward().workers).warm_up()
    n = 64 if quick else 256
    names = ["math"]
    reason = sandbox_unavailable_reason()
    if reason is None:
        names.append("humaneval")
    with serving(latency, REPLIES, {MARKER: PATHOLOGICAL}) as url:
        print(f"server latency {latency} s, {in_flight} in flight, {n} rollouts a turn")
        for name in names:
            print(await ratio_line(url, name, n, in_flight, repeats), flush=True)
        if reason is not None:
            print(f"humaneval skipped: {reason}")
        print(await pathological_line(url, 16 if quick else 32), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.25)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="64 rollouts a turn, 1 repeat")
    args = parser.parse_args()
    asyncio.run(main(args.latency, args.in_flight, 1 if args.quick else args.repeats, args.quick))
