"""The root sandbox: the launcher joins the run's cgroups, builds the namespaces itself and runs
the code as a throwaway uid. It needs root (CI and containers usually are); it costs ~30 ms a
run on 2 cores. Without per-run cgroups it installs the fallback's seccomp filter itself."""

from __future__ import annotations

import itertools
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from art_rlvr.scenarios.rewards.sandbox.cgroups import RunCgroup
from art_rlvr.scenarios.rewards.sandbox.seccomp import filter_program
from art_rlvr.scenarios.rewards.sandbox.spec import LAUNCHER, SandboxLimits, interpreter, kill_group

UID_BASE = 2_100_000_000  # throwaway uids live in [UID_BASE, UID_BASE + UID_SPAN)
UID_SPAN = 1_000_000
_uids = itertools.count()


def precondition() -> str | None:
    """Why the root sandbox cannot run here before trying it, or None."""
    if not sys.platform.startswith("linux") or not hasattr(os, "unshare"):
        return "it needs Linux namespaces (Python >= 3.12 on Linux)"
    if os.geteuid() != 0:
        return "it needs root (it builds the namespaces and runs the code as a throwaway uid)"
    return None


def _next_uid() -> int:
    return UID_BASE + ((os.getpid() % 1000) * 1000 + next(_uids) % 1000) % UID_SPAN


def _owned_by(uids: range) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid in uids:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def sandbox_processes() -> list[int]:
    """PIDs of live processes owned by any throwaway sandbox uid (for cleanup checks)."""
    return _owned_by(range(UID_BASE, UID_BASE + UID_SPAN))


@dataclass
class RootLaunch:
    """The launcher, as root: it builds the namespaces and reaps their init before it exits, so
    only a killed run needs watching until its throwaway uid owns nothing."""

    uid: int
    tmp_mb: int
    group: RunCgroup | None = None
    killed: bool = False
    env: dict[str, str] = field(default_factory=lambda: {"PYTHONHASHSEED": "0"})
    pass_fds: tuple[int, ...] = ()

    @property
    def argv(self) -> list[str]:
        return [interpreter(), "-S", "-s", "-P", str(LAUNCHER)]

    @property
    def job(self) -> dict[str, object]:
        return {
            "mode": "root",
            "uid": self.uid,
            "tmp_mb": self.tmp_mb,
            "cgroups": self.group.join_files if self.group is not None else [],
            "seccomp": b"" if self.group is not None else filter_program(),
        }

    def started(self) -> None:
        pass

    def kill(self, pid: int) -> None:
        self.killed = True
        kill_group(pid)  # the launcher; the namespace's init dies with it, and all with the init

    def gone(self) -> bool:
        return not self.killed or not _owned_by(range(self.uid, self.uid + 1))

    def close(self) -> None:
        pass


def launch(limits: SandboxLimits, group: RunCgroup | None) -> RootLaunch:
    return RootLaunch(uid=_next_uid(), tmp_mb=limits.tmp_mb, group=group)
