"""The watch that bounds a sandboxed run's memory in total where no cgroup can be made: it sees
every process of a forking tree, and their memory summed, which no per-process limit does."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from art_rlvr.scenarios.rewards.sandbox import watch

# a parent and three children, each touching 40 MB and then waiting: none over 60 MB alone
FORKS = textwrap.dedent(
    """
    import os, sys, time
    for _ in range(3):
        if os.fork() == 0:
            break
    held = bytearray(40 * 2**20)
    os.write(1, b"held\\n")  # one write: atomic on a pipe
    time.sleep(60)
    """
)


@pytest.fixture
def forking_tree():
    proc = subprocess.Popen([sys.executable, "-c", FORKS], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(4):
            assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        yield proc
    finally:
        pids = watch.tree(proc.pid)
        for pid in pids:
            subprocess.run(["kill", "-9", str(pid)], check=False)
        proc.wait()


def test_the_tree_holds_every_forked_process(forking_tree: subprocess.Popen) -> None:
    pids = watch.tree(forking_tree.pid)
    assert len(pids) == 4 and pids[0] == forking_tree.pid
    each = [watch.resident_mb([pid]) for pid in pids]
    assert max(each) < 60 < watch.resident_mb(pids), each


@pytest.mark.asyncio
@pytest.mark.parametrize(("limit_mb", "fires"), [(100.0, True), (400.0, False)])
async def test_the_watch_fires_on_the_total(
    forking_tree: subprocess.Popen, limit_mb: float, fires: bool
) -> None:
    try:
        seen = await asyncio.wait_for(watch.over_memory(forking_tree.pid, limit_mb), 2.0)
    except TimeoutError:
        seen = None
    assert (seen is not None) is fires
    if fires:
        assert seen > limit_mb


def test_a_gone_process_counts_nothing() -> None:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(proc.stdout)
    assert watch.resident_mb(watch.tree(pid)) == 0.0
