"""Where no cgroup can be made, a run's processes are bounded in total by watching them: their
resident memory summed over the whole tree, read from /proc every few milliseconds, and the
tree killed once it passes the run's limit.

RLIMIT_AS alone bounds each process, so a solution that forks N children holds N times
`memory_mb`. The watch counts every process under the sandbox's first one (in its own PID
namespace, orphans are re-parented inside the tree). It is a watch, not a cap: what a burst
faults in between two reads is seen late; the figures are in docs/results.md. Resident pages
a forked child still shares with its parent count in both, which errs towards killing.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
INTERVAL_S = 0.005


def tree(pid: int) -> list[int]:
    """`pid` and every process under it, by each thread's /proc `children` list."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            scenarios = list(Path(f"/proc/{current}/task").iterdir())
        except OSError:
            continue
        for scenario in scenarios:
            try:
                todo.extend(int(child) for child in (scenario / "children").read_text().split())
            except (OSError, ValueError):
                continue
    return found


def resident_mb(pids: list[int]) -> float:
    """The summed resident set of `pids` (gone ones count 0)."""
    pages = 0
    for pid in pids:
        try:
            pages += int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return pages * PAGE_BYTES / 2**20


async def over_memory(pid: int, limit_mb: float, interval_s: float = INTERVAL_S) -> float:
    """Returns the tree's resident MB the first time it is above `limit_mb`; until then it
    watches (cancel it when the run ends)."""
    while True:
        seen = resident_mb(tree(pid))
        if seen > limit_mb:
            return seen
        await asyncio.sleep(interval_s)
