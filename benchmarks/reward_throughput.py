"""Scorings per second for each built-in reward, and the code sandbox's per-run overhead.

    uv run python benchmarks/reward_throughput.py [--repeats 5]

One line each, median over repeats. Inputs are the shipped scenarios' own records with a
realistic mix of right and wrong completions; async rewards are driven at their configured
concurrency (math: one request per worker process; code: one sandbox per core). The math pool
is warmed up first, so its numbers exclude the one-off sympy import in each worker.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from art_rlvr import load_scenario
from art_rlvr.core.types import Score
from art_rlvr.scenarios.rewards.code import CodeReward, sandbox_unavailable_reason
from art_rlvr.scenarios.rewards.math import MathReward, verifier_pool
from art_rlvr.scenarios.rewards.numeric import NumericReward
from art_rlvr.scenarios.rewards.qa import QAReward

Case = tuple[dict, str]


def cases(name: str, right: Callable[[dict], str], wrong: Callable[[dict], str]) -> list[Case]:
    scenario = load_scenario(name, seed=0)
    records = [sc.x for split in scenario.splits.values() for sc in split]
    return [(x, right(x) if i % 2 == 0 else wrong(x)) for i, x in enumerate(records)]


async def rate(reward: Callable, batch: list[Case], n: int) -> float:
    """Scorings/s over n scorings, all submitted at once (the reward bounds its concurrency)."""
    work = [batch[i % len(batch)] for i in range(n)]
    started = time.perf_counter()
    results = [reward(x, y) for x, y in work]
    if results and inspect.isawaitable(results[0]):
        results = await asyncio.gather(*results)
    elapsed = time.perf_counter() - started
    assert all(isinstance(r, Score) for r in results)
    return n / elapsed


async def sandbox_latency(reward: CodeReward, runs: int) -> float:
    x = {"prompt": "def f():\n", "test": "def check(candidate):\n    assert candidate() == 1\n",
         "entry_point": "f"}  # fmt: skip
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        score = await reward(x, "    return 1\n")
        times.append(time.perf_counter() - started)
        assert score.correct
    return statistics.median(times)


def bare_python_latency(runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([os.path.realpath(sys.executable), "-S", "-s", "-c", "pass"], check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def main(repeats: int) -> None:
    numeric_cases = cases(
        "gsm8k", lambda x: f"Step one...\nThe answer is {x['answer']}.", lambda x: "It is 7."
    )
    math_cases = cases("math", lambda x: x["solution"], lambda x: "so $\\boxed{\\frac{7}{3}}$")
    qa_cases = cases("qa", lambda x: f"Answer: {x['answers'][0]}", lambda x: "Nobody knows")
    code_cases = cases(
        "humaneval", lambda x: x["canonical_solution"], lambda x: "    return None\n"
    )
    math_reward = MathReward()
    await verifier_pool(math_reward.workers).warm_up()
    subjects: list[tuple[str, Callable, list[Case], int]] = [
        ("numeric", NumericReward(), numeric_cases, 5000),
        ("math", math_reward, math_cases, 400),
        ("qa", QAReward(), qa_cases, 5000),
    ]
    reason = sandbox_unavailable_reason()
    code_reward = CodeReward() if reason is None else None
    if code_reward is not None:
        subjects.append(("code", code_reward, code_cases, 64))
    for name, reward, batch, n in subjects:
        rates = [await rate(reward, batch, n) for _ in range(repeats)]
        extra = f" (concurrency {reward.concurrency})" if name == "code" else ""
        extra = f" ({reward.workers} worker processes)" if name == "math" else extra
        print(f"{name:8s} {statistics.median(rates):10.1f} scorings/s{extra}")
    if code_reward is None:
        print(f"code     skipped: {reason}")
        return
    sandbox = await sandbox_latency(code_reward, 10 * repeats)
    bare = bare_python_latency(10 * repeats)
    print(
        f"sandbox  {sandbox * 1000:10.1f} ms per trivial run, sequential "
        f"(bare `python -S -c pass`: {bare * 1000:.1f} ms; overhead {1000 * (sandbox - bare):.1f} ms)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    asyncio.run(main(parser.parse_args().repeats))
