"""Per-run cgroups: the memory and the number of processes of everything one sandboxed run
starts, counted together.

RLIMIT_AS bounds one process's address space and RLIMIT_NPROC one user's processes (and not
root's), so neither bounds a solution that forks, or that holds memory no address space shows:
SysV shared memory it has detached, memfd files it has unmapped. A memory cgroup is charged for
every page any of its processes faults in (anonymous, shared memory, tmpfs, page tables) and a
pids cgroup counts every task, whoever owns it. Each run gets its own pair under the cgroups of
the process that scores (cgroup v1 `memory` and `pids`, or one v2 directory with both
controllers), is killed as a whole through it, and leaves nothing behind.

Creating them needs write access to our own cgroups: root on most hosts, or a v2 subtree
delegated to the user. Where that is missing, `cgroup_hierarchy` says why and the sandbox falls
back to per-process limits and a watch on the tree's memory in total (`watch.py`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

log = logging.getLogger(__name__)

PREFIX = "art-rlvr-"
HARNESS_MB = 64  # the harness's own processes (supervisor, judge), on top of memory_mb
HARNESS_TASKS = 3  # the namespace's init, the supervisor and the judge, on top of max_processes
_names = itertools.count()


class Hierarchy(BaseModel):
    """Where run cgroups are made: the directories of our own memory and pids cgroups (one
    directory on cgroup v2)."""

    model_config = ConfigDict(frozen=True)

    version: Literal[1, 2]
    memory: Path
    pids: Path

    @property
    def dirs(self) -> tuple[Path, ...]:
        return (self.memory,) if self.memory == self.pids else (self.memory, self.pids)


def own_cgroups(text: str) -> dict[str, str]:
    """/proc/self/cgroup as controller -> path; cgroup v2's line is under ""."""
    found = {}
    for line in text.splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            found[name] = path
    return found


def cgroup_mounts(text: str) -> list[tuple[str, Path, str, set[str]]]:
    """/proc/self/mountinfo's cgroup mounts: (root in the hierarchy, mount point, fs type,
    super options)."""
    mounts = []
    for line in text.splitlines():
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            mounts.append((fields[3], Path(fields[4]), rest[0], set(rest[2].split(","))))
    return mounts


def _under(mount: Path, root: str, path: str) -> Path | None:
    """Our cgroup `path` as a directory under a mount of the hierarchy from `root`."""
    relative = os.path.relpath(path, root)
    return None if relative.startswith("..") else (mount / relative).resolve()


def locate(cgroups: dict[str, str], mounts: list[tuple[str, Path, str, set[str]]]) -> Hierarchy:
    """Our memory and pids cgroups' directories: v1 when both controllers are v1 mounts, else
    v2 when its hierarchy is mounted. Raises LookupError saying what is missing."""
    v1 = {
        name: _under(mount, root, cgroups[name])
        for root, mount, kind, options in mounts
        if kind == "cgroup"
        for name in ("memory", "pids")
        if name in options and name in cgroups
    }
    memory, pids = v1.get("memory"), v1.get("pids")
    if memory is not None and pids is not None:
        return Hierarchy(version=1, memory=memory, pids=pids)
    unified = next(
        (_under(m, r, cgroups[""]) for r, m, kind, _ in mounts if kind == "cgroup2"), None
    )
    if "" in cgroups and unified is not None:
        return Hierarchy(version=2, memory=unified, pids=unified)
    raise LookupError("no cgroup v1 memory and pids controllers and no cgroup v2 mounted")


LIMIT_FILES = {
    1: {"memory": ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"), "pids": ("pids.max",)},
    2: {"memory": ("memory.max", "memory.swap.max"), "pids": ("pids.max",)},
}


@dataclass
class RunCgroup:
    """One run's cgroups: made with its limits, joined by the run's first process, emptied
    and removed after it."""

    hierarchy: Hierarchy
    name: str
    made: list[Path] = field(default_factory=list)

    @property
    def memory(self) -> Path:
        return self.hierarchy.memory / self.name

    @property
    def pids(self) -> Path:
        return self.hierarchy.pids / self.name

    @property
    def join_files(self) -> list[str]:
        """The files a process writes "0" into to join itself: v1's `tasks` (the calling
        thread: the kernel then skips the RCU grace period that moving a whole process waits
        for, ~60 ms here), v2's `cgroup.procs`. The process must still be single-threaded."""
        name = "tasks" if self.hierarchy.version == 1 else "cgroup.procs"
        return [str(d / self.name / name) for d in self.hierarchy.dirs]

    def create(self, memory_bytes: int, scenarios: int) -> None:
        files = LIMIT_FILES[self.hierarchy.version]
        for directory in self.hierarchy.dirs:
            (directory / self.name).mkdir()
            self.made.append(directory / self.name)
        memory, swap = files["memory"]
        (self.memory / memory).write_text(str(memory_bytes))
        if (self.memory / swap).exists():  # no swap either: v1 counts memory + swap here
            (self.memory / swap).write_text(
                "0" if self.hierarchy.version == 2 else str(memory_bytes)
            )
        (self.pids / files["pids"][0]).write_text(str(scenarios))

    def members(self) -> set[int]:
        found: set[int] = set()
        for directory in self.made:
            with contextlib.suppress(OSError):
                found |= {int(p) for p in (directory / "cgroup.procs").read_text().split()}
        return found

    def oom_kills(self) -> int:
        """How many of the run's processes the kernel killed for the memory limit."""
        name = "memory.oom_control" if self.hierarchy.version == 1 else "memory.events"
        try:
            text = (self.memory / name).read_text()
        except OSError:
            return 0
        counts = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
        return int(counts.get("oom_kill", 0))

    def kill_once(self) -> set[int]:
        """SIGKILL everything in the run's cgroups now; what was there."""
        members = self.members()
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return members

    def kill(self, patience_s: float = 5.0) -> None:
        """SIGKILL everything in the run's cgroups until they are empty (a fork bomb forks
        while it is being killed, but no further than pids.max). It blocks: not on a loop."""
        deadline = time.monotonic() + patience_s
        while self.kill_once() and time.monotonic() < deadline:
            time.sleep(0.002)

    def remove(self) -> None:
        """Kill what is left and remove the cgroups (an empty one goes at once; a dying
        process may hold it for a moment)."""
        self.kill()
        for directory in reversed(self.made):
            for _ in range(200):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.005)
            else:
                log.warning("could not remove the sandbox's cgroup %s", directory)
        self.made.clear()


JOIN = (
    'while [ "$1" != -- ]; do echo 0 > "$1" || '
    '{ echo "sandbox setup failed: cannot join the cgroup $1" >&2; exit 125; }; shift; done; '
    'shift; exec "$@"'
)


def join_command(files: list[str]) -> list[str]:
    """A command prefix: a shell that joins `files`' cgroups (`join_files`), then execs the
    rest of the command line."""
    return ["/bin/sh", "-c", JOIN, "join", *files, "--"]


def run_name() -> str:
    return f"{PREFIX}{os.getpid()}-{next(_names)}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(hierarchy: Hierarchy) -> None:
    """Empty run cgroups left by a scorer that was killed (named after its pid)."""
    for directory in hierarchy.dirs:
        for entry in directory.glob(f"{PREFIX}*"):
            owner = entry.name.removeprefix(PREFIX).partition("-")[0]
            if owner.isdigit() and not _pid_alive(int(owner)):
                with contextlib.suppress(OSError):
                    entry.rmdir()


def probe(hierarchy: Hierarchy) -> None:
    """Make and remove a run cgroup with limits; raises OSError where we may not."""
    group = RunCgroup(hierarchy, run_name())
    try:
        group.create(256 * 2**20, 16)
    finally:
        group.remove()


@cache
def cgroup_hierarchy() -> Hierarchy | str:
    """Where this process can make run cgroups, or why it cannot (logged once). Cached: a fact
    about the machine and the user."""
    try:
        hierarchy = locate(
            own_cgroups(Path("/proc/self/cgroup").read_text()),
            cgroup_mounts(Path("/proc/self/mountinfo").read_text()),
        )
        remove_stale(hierarchy)
        probe(hierarchy)
    except (LookupError, OSError, ValueError) as error:
        reason = f"cannot make per-run cgroups here ({error})"
        log.warning(
            "code sandbox: %s; memory is bounded per process (RLIMIT_AS) and watched in total, "
            "processes by RLIMIT_NPROC, and SysV shared memory and memfd are refused (seccomp)",
            reason,
        )
        return reason
    return hierarchy
