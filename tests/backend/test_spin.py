"""The spin governor: reading other processes' CPU from /proc, its hysteresis, and the parked
OpenMP team that makes libgomp throttle; torch work outside the engine on threads that end."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from art_rlvr.backend.runtime import spin
from art_rlvr.backend.runtime.threads import in_own_thread

STAT = """cpu  900 90 300 5000 10 5 5 0 0 0
cpu0 100 10 50 1000 1 1 1 3 0 0
cpu1 200 20 60 1000 2 2 2 4 0 0
cpu2 300 30 70 1000 3 1 1 0 0 0
intr 12345 0 0
ctxt 999
"""
SELF_STAT = "4242 (python3 (a) b) S 1 2 3 4 5 6 7 8 9 10 70 30 0 0 20 0 9 0 100 0 0"


@pytest.mark.parametrize(
    ("cores", "niced", "busy"),
    [
        ({0, 1}, False, (100 + 50 + 1 + 1 + 3) + (200 + 60 + 2 + 2 + 4)),
        ({0, 1}, True, (100 + 50 + 1 + 1 + 3) + (200 + 60 + 2 + 2 + 4) + 10 + 20),
        ({2}, False, 300 + 70 + 1 + 1),
        (set(), False, 0),
    ],
)
def test_busy_ticks_are_summed_over_our_cores_only(cores, niced, busy):
    ticks = spin.read_ticks(STAT, SELF_STAT, cores, niced=niced)
    assert ticks == spin.CpuTicks(busy, 70 + 30)  # utime + stime, a command with spaces


def test_others_are_busy_ticks_less_our_own_in_cores():
    before, after = spin.CpuTicks(1000, 400), spin.CpuTicks(1000 + 3 * spin.TICKS, 400 + spin.TICKS)
    assert spin.others_cores(before, after, 2.0) == pytest.approx(1.0)
    assert spin.others_cores(after, after, 1.0) == 0.0


@pytest.mark.parametrize(
    ("state", "others", "expected"),
    [
        (spin.Throttle(), 0.0, spin.Throttle()),
        (spin.Throttle(), 0.2, spin.Throttle()),  # under the start threshold: stays off
        (spin.Throttle(), 0.3, spin.Throttle(True, 0)),  # on at once
        (spin.Throttle(True, 2), 0.5, spin.Throttle(True, 0)),  # busy again: the count restarts
        (spin.Throttle(True, 0), 0.05, spin.Throttle(True, 1)),  # calm: counted
        (spin.Throttle(True, 2), 0.15, spin.Throttle(True, 0)),  # between: not calm
        (spin.Throttle(True, 3), 0.05, spin.Throttle()),  # the fourth calm reading: off
    ],
)
def test_throttle_turns_on_quickly_and_off_after_calm_readings(state, others, expected):
    assert state.next(others) == expected


def _threads(expected: int | None = None) -> int:
    """The process's thread count; with `expected`, waits up to 5 s for it (a thread that
    ended lingers in /proc for a moment)."""
    deadline = time.monotonic() + 5
    while True:
        count = len(os.listdir("/proc/self/task"))
        if expected is None or count == expected or time.monotonic() > deadline:
            return count
        time.sleep(0.01)


linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@linux
def test_a_busy_process_on_our_cores_is_seen_as_others():
    governor = spin.SpinGovernor()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # our affinity, inherited
    try:
        time.sleep(0.5)  # started
        before, started = governor.reading(), time.monotonic()
        time.sleep(1.0)
        seen = spin.others_cores(before, governor.reading(), time.monotonic() - started)
    finally:
        busy.kill()
        busy.wait()
    assert seen >= 0.5  # the loop alone takes one core while this test sleeps


@linux
def test_throttling_parks_a_team_of_cores_plus_one_threads_and_lets_it_go():
    torch.ones(1 << 22).sum()  # libgomp loaded and initialised, as in any torch process
    governor = spin.SpinGovernor()
    assert governor.available
    before = _threads()
    governor.apply(spin.Throttle(True))
    assert _threads() == before + len(governor.cores) + 1  # the holder and its team's workers
    governor.apply(spin.Throttle(True))  # already held: nothing more
    assert _threads() == before + len(governor.cores) + 1
    governor.apply(spin.Throttle())
    assert _threads(before) == before  # a thread that ends frees its OpenMP pool
    assert governor.switches == 2


@linux
def test_the_process_governor_runs_while_anyone_holds_it():
    shared = spin.SharedGovernor()  # the process's own is held by other tests' backends
    first = shared.acquire()
    try:
        second = shared.acquire()
        assert second is first
        shared.release()
        assert first._thread is not None and first._thread.is_alive()
    finally:
        shared.release()
    assert first._thread is None  # stopped with its last user (and its team let go)
    assert first.state == spin.Throttle()


async def test_torch_work_runs_on_a_thread_that_ends_with_it():
    caller = threading.get_ident()
    ran_on: list[threading.Thread] = []

    def work(a: int, *, b: int) -> int:
        ran_on.append(threading.current_thread())
        return a + b

    assert await in_own_thread(work, 2, b=3) == 5
    assert ran_on[0].ident != caller
    await asyncio.sleep(0.05)
    assert not ran_on[0].is_alive()

    def fails() -> None:
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        await in_own_thread(fails)
