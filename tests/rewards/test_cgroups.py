"""Finding our own cgroups (v1 controllers or the v2 hierarchy), from the kernel's files, and
the fallback's seccomp filter's shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from art_rlvr.scenarios.rewards.sandbox.cgroups import cgroup_mounts, locate, own_cgroups
from art_rlvr.scenarios.rewards.sandbox.seccomp import filter_program

V1_CGROUP = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n0::/\n"
V1_MOUNTS = (
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
V2_CGROUP = "0::/user.slice/user-1000.slice/app.scope\n"
V2_MOUNTS = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
NS_CGROUP = "0::/\n"  # inside a cgroup namespace: the mount's root is ours
NS_MOUNTS = "30 23 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"


@pytest.mark.parametrize(
    ("cgroup", "mounts", "version", "memory", "pids"),
    [
        (
            V1_CGROUP,
            V1_MOUNTS,
            1,
            "/sys/fs/cgroup/memory/process_api/abc",
            "/sys/fs/cgroup/pids",
        ),
        (
            V2_CGROUP,
            V2_MOUNTS,
            2,
            "/sys/fs/cgroup/user.slice/user-1000.slice/app.scope",
            "/sys/fs/cgroup/user.slice/user-1000.slice/app.scope",
        ),
        (NS_CGROUP, NS_MOUNTS, 2, "/sys/fs/cgroup", "/sys/fs/cgroup"),
    ],
)
def test_locate_finds_our_cgroups(
    cgroup: str, mounts: str, version: int, memory: str, pids: str
) -> None:
    found = locate(own_cgroups(cgroup), cgroup_mounts(mounts))
    assert (found.version, found.memory, found.pids) == (version, Path(memory), Path(pids))


def test_locate_says_what_is_missing() -> None:
    with pytest.raises(LookupError, match="no cgroup v1 memory and pids"):
        locate(own_cgroups("4:memory:/\n"), cgroup_mounts(V1_MOUNTS.splitlines()[0]))


@pytest.mark.parametrize(("arch", "instructions"), [("x86_64", 9), ("aarch64", 8), ("riscv64", 0)])
def test_the_filter_has_one_check_a_refused_call(arch: str, instructions: int) -> None:
    program = filter_program(arch)
    assert len(program) == 8 * instructions
