"""Hostile solutions that try to hold memory and processes, and a way to measure from outside
what one held: shared by the sandbox's bound tests and `benchmarks/sandbox_bombs.py`.

Each bomb is the body of `def f():` (a task whose test is `assert candidate() == 1`); all but
the fork bomb hold what they got until the sandbox's timeout kills them, so the peak is what
they held. `held` runs a command in a fresh cgroup v1 pair of its own (memory capped at `cap_mb`,
tasks at `max_tasks`), which both measures the command's whole process tree and bounds it: a
sandbox that does not bound a bomb cannot take the machine down, and a figure at the cap means
"unbounded, stopped by the measuring cgroup". It needs root and cgroup v1 memory and pids.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

TASK = {
    "prompt": "def f():\n",
    "test": "def check(candidate):\n    assert candidate() == 1\n",
    "entry_point": "f",
}
HOLD = "    import time\n    time.sleep(600)\n"
FORK = (
    "    import os\n    for _ in range(32):\n        try:\n            if os.fork() == 0:\n"
    "                break\n        except OSError:\n            break\n"
)
ANON = (
    "    hoard = []\n    try:\n        while True:\n"
    "            hoard.append(bytearray(2**24))\n    except MemoryError:\n        pass\n"
)
MEMFD = (
    "    import os\n    fds, chunk = [], bytes(2**20)\n    try:\n        while True:\n"
    "            fd = os.memfd_create('x')\n            fds.append(fd)\n"
    "            try:\n                while True:\n                    os.write(fd, chunk)\n"
    "            except OSError as error:\n                if error.errno != 27:\n"
    "                    break\n    except OSError:\n        pass\n"
)
SHM = (
    "    import ctypes\n    libc = ctypes.CDLL(None, use_errno=True)\n"
    "    libc.shmat.restype = ctypes.c_void_p\n    size = 2**26\n"
    "    while True:\n        sid = libc.shmget(0, ctypes.c_size_t(size), 0o1600)\n"
    "        if sid < 0:\n            break\n"
    "        at = libc.shmat(sid, None, 0)\n        if at in (None, ctypes.c_void_p(-1).value):\n"
    "            break\n        ctypes.memset(at, 1, size)\n"
    "        libc.shmdt(ctypes.c_void_p(at))\n"
)
BOMBS = {
    "trivial": "    return 1\n",
    "memory": ANON + HOLD,
    "fork_memory": FORK + ANON + HOLD,
    "sysv_shm": SHM + HOLD,  # detached segments: no address space shows them
    "memfd": MEMFD + HOLD,  # memfd files written, never mapped
    "fork_memfd": FORK + MEMFD + HOLD,
    "fork_bomb": (
        "    import os\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n"
    ),
}


class Held(BaseModel):
    """What a command's whole process tree peaked at, and how it ended."""

    model_config = ConfigDict(frozen=True)

    peak_mb: float
    peak_tasks: int
    oom_kills: int  # by the measuring cgroup: the command went over `cap_mb`
    returncode: int
    stdout: str
    stderr: str


def own_v1_cgroup(controller: str) -> Path:
    """This process's cgroup v1 directory for `controller`."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return Path("/sys/fs/cgroup") / controller / path.lstrip("/")
    raise LookupError(f"no cgroup v1 {controller} controller here")


def measurable() -> str | None:
    """Why `held` cannot run here, or None."""
    if os.geteuid() != 0:
        return "measuring a process tree from outside needs root (it makes cgroups)"
    try:
        for controller in ("memory", "pids"):
            if not (own_v1_cgroup(controller) / "cgroup.procs").exists():
                return f"no cgroup v1 {controller} hierarchy mounted"
    except LookupError as error:
        return str(error)
    return None


def _empty(group: Path) -> None:
    for _ in range(200):
        left = (group / "cgroup.procs").read_text().split()
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.02)
    group.rmdir()


def held(
    command: list[str],
    *,
    cap_mb: int = 2048,
    max_tasks: int = 2000,
    timeout_s: float = 120,
    env: dict[str, str] | None = None,
) -> Held:
    """Run `command` in a fresh measuring cgroup; its peaks (memory charged, tasks)."""
    name = f"art-rlvr-measure-{os.getpid()}-{time.monotonic_ns()}"
    memory, pids = own_v1_cgroup("memory") / name, own_v1_cgroup("pids") / name
    memory.mkdir()
    pids.mkdir()
    try:
        (memory / "memory.limit_in_bytes").write_text(str(cap_mb * 2**20))
        (pids / "pids.max").write_text(str(max_tasks))
        join = f'echo $$ > {memory}/cgroup.procs && echo $$ > {pids}/cgroup.procs && exec "$@"'
        done = subprocess.run(
            ["sh", "-c", join, "sh", *command],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
        oom = dict(
            line.split() for line in (memory / "memory.oom_control").read_text().splitlines()
        )
        return Held(
            peak_mb=int((memory / "memory.max_usage_in_bytes").read_text()) / 2**20,
            peak_tasks=int((pids / "pids.peak").read_text()),
            oom_kills=int(oom.get("oom_kill", 0)),
            returncode=done.returncode,
            stdout=done.stdout,
            stderr=done.stderr,
        )
    finally:
        _empty(memory)
        _empty(pids)
