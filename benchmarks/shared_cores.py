"""Two runs on the same cores: how much each slows the other, by OpenMP spin setting.

torch's OpenMP threads (libgomp) spin before they sleep when they run out of work: 300,000
spins by default. Two processes at 2 threads each on 2 cores then keep spinning on cores the
other process needs. art_rlvr sets `GOMP_SPINCOUNT=30000` when it is imported before torch
(`art_rlvr/__init__.py`), and TorchBackend makes libgomp throttle to 100 spins while other
processes use its cores (`art_rlvr/backend/runtime/spin.py`); this measures both, with a CLI evaluation
of `arith`:

- `alone`: one `python -m art_rlvr.run scenario=arith mode=eval` (process start to end);
- `pair`: two of them started together; `pair / alone` is 2.0 if the cores were simply shared.

`--spins default` is art_rlvr's own setting (what a user's run gets); a number sets
GOMP_SPINCOUNT (1000 was art_rlvr's default until 2026-11-25; the throttle still applies).
`--default-run` times the README's command 1 instead (`scenario=arith`, the whole default RL
run: 24 steps and 4 evaluations) at art_rlvr's own setting: a user's run beside a second one.

Settings alternate within each repeat; the machine should be otherwise idle.

    uv run python benchmarks/shared_cores.py [--val-limit 100] [--spins default 1000] [--repeats 1]
    uv run python benchmarks/shared_cores.py --default-run
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

DEFAULT_SPINS = "default"  # leave GOMP_SPINCOUNT to art_rlvr (what a user's run gets)


def started_run(spins: str, val_limit: int | None, run_dir: Path) -> subprocess.Popen:
    """A CLI evaluation of `val_limit` val prompts, or with None the whole default run."""
    command = [sys.executable, "-m", "art_rlvr.run", "scenario=arith", f"run_dir={run_dir}"]
    if val_limit is not None:
        command += ["mode=eval", "eval_test=false", f"val_limit={val_limit}"]
    env = dict(os.environ)
    env.pop("GOMP_SPINCOUNT", None)
    if spins != DEFAULT_SPINS:
        env["GOMP_SPINCOUNT"] = spins
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def timed(spins: str, val_limit: int | None, count: int, tmp: Path) -> float:
    """Seconds until all `count` runs started together have finished."""
    started = time.perf_counter()
    runs = [
        started_run(spins, val_limit, tmp / f"{spins}-{time.time_ns()}-{i}") for i in range(count)
    ]
    for run in runs:
        _, err = run.communicate()
        if run.returncode != 0:
            raise SystemExit(f"a run failed:\n{err.decode()[-2000:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--val-limit", type=int, default=100)
    parser.add_argument("--spins", nargs="+", default=[DEFAULT_SPINS, "1000"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--default-run", action="store_true", help="time README command 1")
    args = parser.parse_args()
    val_limit = None if args.default_run else args.val_limit
    if args.default_run:
        args.spins = [DEFAULT_SPINS]
    what = "the default run" if val_limit is None else f"{val_limit} val prompts"
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, {what}", flush=True)
    seconds: dict[tuple[str, str], list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for spins in args.spins:
                for label, count in (("alone", 1), ("pair", 2)):
                    seconds[(spins, label)].append(timed(spins, val_limit, count, Path(tmp)))
    for spins in args.spins:
        alone = statistics.median(seconds[(spins, "alone")])
        pair = statistics.median(seconds[(spins, "pair")])
        print(
            f"GOMP_SPINCOUNT={spins:>7}: alone {alone:6.1f} s, pair {pair:6.1f} s, "
            f"pair / alone {pair / alone:.2f} (2.00 = the cores simply shared)"
        )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
