"""What a sandboxed run is given (limits) and how one is started (a `Launch`)."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

LAUNCHER = Path(__file__).with_name("launcher.py")
SETUP_FAILED = 125  # the launcher's exit code when it could not build the sandbox
SandboxKind = Literal["root", "bwrap"]


class SandboxLimits(BaseModel):
    """Per-run limits; the defaults fit HumanEval-style unit tests with room to spare.

    `memory_mb` and `max_processes` bound the run in total where per-run cgroups can be made
    (root, or a delegated cgroup v2 subtree): every process of the solution together, shared
    memory and memfd included, plus the harness's own (`cgroups.HARNESS_MB`, `HARNESS_TASKS`).
    Elsewhere `memory_mb` bounds each process (RLIMIT_AS) and, with the harness's share, the
    tree's resident memory in total (watched, `watch.py`), and shared memory is refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_s: float = Field(default=6.0, gt=0, le=600)
    memory_mb: int = Field(default=1024, ge=64)
    max_processes: int = Field(default=8, ge=1, le=256)
    max_output_bytes: int = Field(default=256_000, ge=1024)
    max_file_mb: int = Field(default=16, ge=1)
    tmp_mb: int = Field(default=32, ge=1)

    def rlimits(self) -> dict[str, int]:
        return {
            "RLIMIT_AS": self.memory_mb * 2**20,
            "RLIMIT_CPU": math.ceil(self.timeout_s),
            "RLIMIT_NPROC": self.max_processes,  # the launcher adds the harness's own
            "RLIMIT_FSIZE": self.max_file_mb * 2**20,
            "RLIMIT_NOFILE": 256,
            "RLIMIT_CORE": 0,
        }


class Launch(Protocol):
    """One run of one kind of sandbox: the command line, the launcher's job fields, the
    environment and descriptors the command starts with, and how to end it."""

    @property
    def argv(self) -> list[str]: ...

    @property
    def job(self) -> dict[str, object]: ...

    @property
    def env(self) -> dict[str, str]: ...

    @property
    def pass_fds(self) -> tuple[int, ...]: ...

    def started(self) -> None:
        """The command is running: drop the parent's copies of what it was handed."""

    def kill(self, pid: int) -> None:
        """Kill the whole tree started as `pid`."""

    def gone(self) -> bool:
        """Whether nothing of the run is left (asked once the command has exited)."""

    def close(self) -> None: ...


def interpreter() -> str:
    """The real Python binary: the launcher runs with `-S`, so no virtualenv is needed."""
    return os.path.realpath(sys.executable)


def python_prefixes() -> list[str]:
    """The Python install's directories outside /usr, outermost only (the sandbox binds them)."""
    prefixes = (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)
    found = sorted({os.path.realpath(p) for p in prefixes})
    return [
        p
        for p in found
        if not p.startswith("/usr/")
        and not any(p != q and p.startswith(q.rstrip("/") + "/") for q in found)
    ]


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
