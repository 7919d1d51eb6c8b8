"""Per-check cost of the code sandboxes, side by side: root namespaces, bubblewrap (the
unprivileged one) and a bare subprocess that runs the same program with no isolation at all.

    uv run python benchmarks/sandbox_overhead.py [--rounds 5] [--checks 20]

A check is one HumanEval-style scoring: a short program and one test unit, through `CodeReward`
(which parses, runs the sandbox and reads its reports). The bare row starts the same interpreter
with the same flags on the same program through the same asyncio plumbing. Rounds interleave
the three, so machine load hits them alike; each line is the median over rounds of (a) one check
at a time, in ms, and (b) checks per second with the reward's default concurrency. As root all
three run; as another user the root row says why not (run it as both to compare). The tools'
own cost: "bubblewrap, bare program" wraps the bare program in the unprivileged sandbox's bwrap
command, and with `uv run --with sandlock==0.9.0 ...` "sandlock, bare program" runs it under
sandlock (Landlock + seccomp, the alternative measured and not picked).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

from art_rlvr.scenarios.rewards.code import CodeReward
from art_rlvr.scenarios.rewards.sandbox import SandboxLimits, bwrap, sandbox_problem

TASK = {
    "prompt": "def f(xs):\n",
    "test": "def check(candidate):\n    assert candidate([3, 1, 2]) == [1, 2, 3]\n",
    "entry_point": "f",
}
BODY = "    return sorted(xs)\n"
PROGRAM = TASK["prompt"] + BODY + "assert f([3, 1, 2]) == [1, 2, 3]\n"

Check = Callable[[], Awaitable[None]]


BARE = [os.path.realpath(sys.executable), "-S", "-s", "-P", "-c", PROGRAM]


async def run(argv: list[str], pass_fds: tuple[int, ...] = ()) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PYTHONHASHSEED": "0"},
        cwd="/",
        start_new_session=True,
        pass_fds=pass_fds,
    )
    _, err = await proc.communicate()
    assert proc.returncode == 0, err


async def bare_check() -> None:
    await run(BARE)


async def bwrap_bare_check() -> None:
    """bubblewrap's own cost: its namespaces and mounts around the bare program."""
    launch = bwrap.launch(SandboxLimits(), None)  # no cgroup: the seccomp gate
    try:
        argv = launch.argv
        await run([*argv[: argv.index("--") + 1], *BARE], launch.pass_fds)
    finally:
        launch.close()


def sandlock_check() -> Check | None:
    """The same bare program under sandlock (Landlock + seccomp; the alternative we measured
    and did not pick), when it is installed: `uv run --with sandlock==0.9.0 ...`."""
    try:
        import sandlock
    except ImportError:
        return None
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
    readable = [p for p in ("/usr", "/bin", "/lib", "/lib64", "/dev") if os.path.exists(p)]
    work = tempfile.mkdtemp(prefix="sandlock-")

    async def check() -> None:
        box = sandlock.Sandbox(
            fs_readable=[*readable, *prefixes],
            fs_writable=[work],
            max_memory="1024M",
            max_processes=8,
            clean_env=True,
            cwd=work,
        )
        result = await asyncio.to_thread(box.run, BARE, timeout=6)
        assert result.success, result

    return check


def reward_check(reward: CodeReward) -> Check:
    async def check() -> None:
        score = await reward(TASK, BODY)
        assert score.correct, score.feedback

    return check


async def sequential_ms(check: Check, n: int) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        await check()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


async def per_second(check: Check, n: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await check()

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return n / (time.perf_counter() - started)


async def main(rounds: int, checks: int) -> None:
    concurrency = CodeReward().concurrency
    subjects: dict[str, Check] = {"bare subprocess (no isolation)": bare_check}
    skipped = {}
    for kind, label in (("root", "root namespaces"), ("bwrap", "bubblewrap (unprivileged)")):
        problem = sandbox_problem(kind)
        if problem is None:
            subjects[label] = reward_check(CodeReward(sandbox=kind))
        else:
            skipped[label] = problem
    if "bubblewrap (unprivileged)" in subjects:
        subjects["bubblewrap, bare program"] = bwrap_bare_check
    if (check := sandlock_check()) is not None:
        subjects["sandlock, bare program"] = check
    for check in subjects.values():  # warm up: imports, caches, page cache
        await sequential_ms(check, 3)
    latency: dict[str, list[float]] = {name: [] for name in subjects}
    rate: dict[str, list[float]] = {name: [] for name in subjects}
    for _ in range(rounds):
        for name, check in subjects.items():
            latency[name].append(await sequential_ms(check, checks))
            rate[name].append(await per_second(check, 2 * checks, concurrency))
    bare = statistics.median(latency["bare subprocess (no isolation)"])
    print(
        f"uid {os.geteuid()}, {os.cpu_count()} cores, {rounds} rounds x {checks} checks, "
        f"concurrency {concurrency}"
    )
    print(f"{'':32s} {'ms/check':>9s} {'vs bare':>8s} {'checks/s':>9s}")
    for name in subjects:
        ms = statistics.median(latency[name])
        print(f"{name:32s} {ms:9.1f} {ms / bare:7.2f}x {statistics.median(rate[name]):9.1f}")
    root, unprivileged = "root namespaces", "bubblewrap (unprivileged)"
    if root in latency and unprivileged in latency:
        ratio = statistics.median(latency[unprivileged]) / statistics.median(latency[root])
        print(f"bubblewrap / root: {ratio:.2f}x per check")
    for name, problem in skipped.items():
        print(f"{name:32s} skipped: {problem}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--checks", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.checks))
