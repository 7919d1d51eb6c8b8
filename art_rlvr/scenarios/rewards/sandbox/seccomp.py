"""The fallback's seccomp filter: without a per-run memory cgroup, nothing counts memory that no
address space shows (SysV shared memory a process has detached, memfd files it has unmapped),
so the system calls that make it are refused with EPERM; everything else is allowed.

A classic BPF program, built here as bytes (`struct sock_filter` is 8 bytes: u16 code, u8 jt,
u8 jf, u32 k), handed to bubblewrap's `--seccomp FD` or installed by the root launcher with
prctl(PR_SET_SECCOMP). x86-64 and aarch64 know the calls by number; on another architecture
there is no filter (the fallback then bounds less).
"""

from __future__ import annotations

import errno
import platform
import struct

# from linux/audit.h and the two architectures' syscall tables
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
REFUSED = {  # memfd_create, shmget, memfd_secret
    "x86_64": (319, 29, 447),
    "aarch64": (279, 194, 447),
}
X32_BIT = 0x40000000  # x86-64's x32 ABI numbers: refused as a whole
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
ARCH_OFFSET, NR_OFFSET = 4, 0  # in struct seccomp_data
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def machine() -> str:
    return platform.machine()


def filter_program(arch: str | None = None) -> bytes:
    """The filter for `arch` (this machine's by default); empty where the calls are unknown."""
    arch = arch or machine()
    if arch not in REFUSED:
        return b""
    numbers = REFUSED[arch]
    deny = _op(RET_K, RET_ERRNO | errno.EPERM)
    allow = _op(RET_K, RET_ALLOW)
    checks = [_op(JEQ_K, nr, jt=len(numbers) - i + (arch == "x86_64"), jf=0)
              for i, nr in enumerate(numbers)]  # fmt: skip
    # each check jumps over the rest, the x32 check and `allow` to `deny`
    body = b"".join(checks)
    if arch == "x86_64":
        body += _op(JGE_K, X32_BIT, jt=1, jf=0)
    head = _op(LD_W_ABS, ARCH_OFFSET)
    # another architecture's calls (the 32-bit ABI, which has other numbers): refused
    head += _op(JEQ_K, AUDIT_ARCH[arch], jt=0, jf=1 + len(numbers) + (arch == "x86_64") + 1)
    head += _op(LD_W_ABS, NR_OFFSET)
    return head + body + allow + deny
