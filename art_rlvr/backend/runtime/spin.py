"""OpenMP spinning that gives way when other processes want our cores.

torch's CPU kernels run on libgomp teams whose idle threads spin before they sleep
(`GOMP_SPINCOUNT`, read once when torch loads). Alone, a decode step's hundreds of parallel
regions want their threads awake: at 1,000 spins a 36-row step took 1.6x its time at 30,000.
Beside another busy process, spinning threads hold cores the other needs: two evaluations
started together took 4.5x one alone at 30,000 spins, 1.1x at 1,000 (docs/results.md,
2026-11-25 12:00-12:45).

libgomp cannot be told a new spin count, but it throttles every wait to 100 spins (its
documented rule) while the process holds more OpenMP threads than it has cores. `SpinGovernor`
uses that: it measures the CPU time other processes take on our cores (`/proc/stat` less our
own `/proc/self/stat`) and, while they take a quarter of a core or more, keeps a parked thread
holding an idle team of cores + 1 threads; it lets it go once they have taken under a tenth of
a core for two seconds. Spinning changes no result, only where the time goes.

One governor per process (libgomp is one per process): `acquire` and `release` count users.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

__all__ = ["SharedGovernor", "SpinGovernor", "Throttle", "acquire", "others_cores", "release"]

log = logging.getLogger(__name__)

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class CpuTicks(NamedTuple):
    """Clock ticks, summed over our cores: busy (others' and ours) and our process's own."""

    busy: int
    own: int


def read_ticks(stat: str, self_stat: str, cores: set[int], *, niced: bool) -> CpuTicks:
    """Busy and own ticks from `/proc/stat` and `/proc/self/stat` text.

    Time at positive niceness counts only when we are niced ourselves: a niced process yields
    to ours, so its cycles are not ones our spinning takes from anyone who matters."""
    busy = 0
    for line in stat.splitlines():
        name, *fields = line.split() or [""]
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cores:
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
        busy += user + system + irq + softirq + steal + (nice if niced else 0)
    # fields after the command (which may hold spaces) start at state; utime, stime are 14, 15
    after = self_stat[self_stat.rindex(")") + 2 :].split()
    return CpuTicks(busy, int(after[11]) + int(after[12]))


def others_cores(before: CpuTicks, after: CpuTicks, seconds: float) -> float:
    """Cores' worth of CPU other processes took on our cores between two readings."""
    others = (after.busy - before.busy) - (after.own - before.own)
    return max(others, 0) / TICKS / max(seconds, 1e-6)


@dataclass(frozen=True)
class Throttle:
    """The governor's state: whether libgomp is throttled, and the calm readings since."""

    on: bool = False
    calm: int = 0

    def next(self, others: float, *, start: float = 0.25, stop: float = 0.1, calm: int = 4):
        """The state after a reading of `others` cores (hysteresis: quick on, slow off)."""
        if others >= start:
            return Throttle(True, 0)
        if not self.on:
            return self
        quiet = self.calm + 1 if others < stop else 0
        return Throttle(quiet < calm, quiet if quiet < calm else 0)


def _libgomp() -> ctypes.CDLL | None:
    """The libgomp this process loaded (torch's own copy on Linux wheels), if any."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = {line.split()[-1] for line in maps.splitlines() if "libgomp" in line.split()[-1]}
    return ctypes.CDLL(sorted(paths)[0]) if paths else None


_TEAM_BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Team:
    """A parked thread holding an idle libgomp team of `size` threads until `close`."""

    def __init__(self, gomp: ctypes.CDLL, size: int) -> None:
        self._stop = threading.Event()
        self._body = _TEAM_BODY(lambda _data: None)
        self._started = threading.Event()

        def hold() -> None:
            try:
                gomp.GOMP_parallel(self._body, None, ctypes.c_uint(size), ctypes.c_uint(0))
            finally:
                self._started.set()
            self._stop.wait()  # the thread's pool lives as long as the thread

        self._thread = threading.Thread(target=hold, name="art-rlvr-spin-throttle", daemon=True)
        self._thread.start()
        self._started.wait(timeout=10)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class SpinGovernor:
    """Throttles libgomp's spinning while other processes take CPU on our cores."""

    def __init__(self, interval: float = 0.5) -> None:
        self.cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        self.niced = hasattr(os, "getpriority") and os.getpriority(os.PRIO_PROCESS, 0) > 0
        self.interval = interval
        self.state = Throttle()
        self.switches = 0
        self._gomp = _libgomp()
        self._team: _Team | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        """Linux with torch on libgomp: there is something to govern and a way to read load."""
        return (
            hasattr(self._gomp, "GOMP_parallel")
            and bool(self.cores)
            and Path("/proc/stat").exists()
        )

    def reading(self) -> CpuTicks:
        stat, own = Path("/proc/stat").read_text(), Path("/proc/self/stat").read_text()
        return read_ticks(stat, own, self.cores, niced=self.niced)

    def start(self) -> None:
        if self.available and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="art-rlvr-spin", daemon=True)
            self._thread.start()

    def apply(self, state: Throttle) -> None:
        """Hold or drop the extra team so that libgomp's throttle matches `state`."""
        if state.on and self._team is None and self._gomp is not None:
            self._team = _Team(self._gomp, len(self.cores) + 1)
            self.switches += 1
            log.debug("other processes use our cores: OpenMP threads stop spinning")
        elif not state.on and self._team is not None:
            self._team.close()
            self._team = None
            self.switches += 1
            log.debug("our cores are ours again: OpenMP threads spin")
        self.state = state

    def _run(self) -> None:
        before, then = self.reading(), time.monotonic()
        while not self._stop.wait(self.interval):
            after, now = self.reading(), time.monotonic()
            self.apply(self.state.next(others_cores(before, after, now - then)))
            before, then = after, now

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.apply(Throttle())


class SharedGovernor:
    """The process's governor and how many backends use it (libgomp is one per process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.governor: SpinGovernor | None = None
        self.users = 0

    def acquire(self) -> SpinGovernor:
        """The governor, started on first use."""
        with self.lock:
            if self.governor is None:
                self.governor = SpinGovernor()
                self.governor.start()
            self.users += 1
            return self.governor

    def release(self) -> None:
        """Stop the governor when its last user is done with it."""
        with self.lock:
            self.users = max(self.users - 1, 0)
            if self.users == 0 and self.governor is not None:
                self.governor.close()
                self.governor = None


_PROCESS = SharedGovernor()
acquire, release = _PROCESS.acquire, _PROCESS.release
