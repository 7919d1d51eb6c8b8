"""What glibc's allocator settings cost a GRPO step: the mmap threshold pinned at 64 KB with no
trimming (until 2026-11-23) against 4 MB plus `malloc_trim` after each training step and when
the engine goes idle (now). Each setting runs in its own process (a heap's history is
per-process), alternately, on the same seeded rollouts of `arith` with forced signal:

    uv run python benchmarks/malloc_threshold.py [--steps 8] [--repeats 1]

Prints per setting the median rollout and training seconds a step, their kernel (sys) CPU
seconds, RSS after the first and the last step, peak RSS, and the step-time ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time

SETTINGS = {"64 KB, no trim (before)": (64 * 1024, False), "4 MB + trim (now)": (4 << 20, True)}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


async def child(threshold: int, trim: bool, steps: int) -> None:
    import art

    from art_rlvr import (
        DEFAULT_BASE_MODEL,
        SamplingConfig,
        TorchBackend,
        gather_groups,
        load_scenario,
    )
    from art_rlvr.backend import torch_backend
    from art_rlvr.backend.engine import generation as engine

    if not trim:  # the old behaviour: nothing gives freed heap pages back
        torch_backend.release_free_memory = engine.release_free_memory = lambda: False
    scenario = load_scenario("arith", seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        backend = TorchBackend(path=tmp, seed=0)
        ctypes.CDLL("libc.so.6").mallopt(-3, threshold)  # M_MMAP_THRESHOLD
        model = art.TrainableModel(
            name="m", project="bench", run_name="malloc", base_model=DEFAULT_BASE_MODEL
        )
        await model.register(backend)
        for step in range(steps):
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            groups = await gather_groups(
                model,
                scenario.splits["train"][step * 6 : (step + 1) * 6],
                6,
                sampling=SamplingConfig(max_tokens=32),
                seed=step,
                description="rollouts",
            )
            r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for group in groups:  # every group trains: the cost we want to see
                for i, trajectory in enumerate(group.trajectories):
                    trajectory.reward = float(i % 2)
            await backend.train(model, groups, learning_rate=1e-5)
            r2, t2 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            row = {
                "rollouts": t1 - t0,
                "rollouts_sys": r1.ru_stime - r0.ru_stime,
                "train": t2 - t1,
                "train_sys": r2.ru_stime - r1.ru_stime,
                "rss": rss_mb(),
            }
            print("ROW " + json.dumps(row), flush=True)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print("ROW " + json.dumps({"peak": peak}), flush=True)
        await backend.close()


def run_setting(threshold: int, trim: bool, steps: int) -> list[dict[str, float]]:
    cmd = [sys.executable, __file__, "--child", str(threshold), str(int(trim)), str(steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [json.loads(line[4:]) for line in out.splitlines() if line.startswith("ROW ")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--child", nargs=3, type=int, metavar=("THRESHOLD", "TRIM", "STEPS"))
    args = parser.parse_args()
    if args.child:
        threshold, trim, steps = args.child
        asyncio.run(child(threshold, bool(trim), steps))
        return
    rows: dict[str, list[list[dict[str, float]]]] = {name: [] for name in SETTINGS}
    for _ in range(args.repeats):
        for name, (threshold, trim) in SETTINGS.items():
            rows[name].append(run_setting(threshold, trim, args.steps))
    step_time = {}
    for name, runs in rows.items():
        steps = [r for run in runs for r in run[1:-1]]  # the first step warms up
        med = {k: statistics.median(r[k] for r in steps) for k in steps[0]}
        step_time[name] = med["rollouts"] + med["train"]
        first = statistics.median(run[0]["rss"] for run in runs)
        last = statistics.median(run[-2]["rss"] for run in runs)
        peak = statistics.median(run[-1]["peak"] for run in runs)
        print(
            f"{name:>24}: rollouts {med['rollouts']:.2f} s (sys {med['rollouts_sys']:.2f}), "
            f"train {med['train']:.2f} s (sys {med['train_sys']:.2f}) a step; RSS after step 1 "
            f"{first:.0f} MB, after step {args.steps} {last:.0f} MB, peak {peak:.0f} MB"
        )
    before, now = step_time.values()
    print(f"step time before / now: {before / now:.2f}x")


if __name__ == "__main__":
    main()
