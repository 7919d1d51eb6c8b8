"""Run untrusted Python against its tests in a throwaway sandbox.

Model-written code is hostile by default. Each run happens in a fresh process tree that:

- lives in new mount, PID, network, IPC and UTS namespaces (so: no network at all, it sees only
  its own processes, its SysV shared memory dies with it, and everything in it dies when its
  init process exits);
- is bounded in total by a cgroup of its own where one can be made (`cgroups.py`: memory,
  shared memory and memfd included, and the number of processes, whoever owns them); elsewhere
  by a watch on the whole tree's resident memory (`watch.py`), RLIMIT_AS per process and
  RLIMIT_NPROC, with shared memory and memfd refused (`seccomp.py`), said once in the log;
- has a read-only root holding only /usr, the Python install and four /dev nodes, with a
  writable, size-limited tmpfs at /tmp/work (the host's home, /tmp, /work... are absent);
- runs unprivileged with no_new_privs and resource limits (address space, CPU seconds, process
  count, file size, open files), and an environment built from nothing;
- is killed as a whole on a wall-clock timeout or when its output passes a cap.

Two ways to build it, picked by `choose_sandbox`: as root the launcher (`launcher.py`, run by
path) builds the namespaces itself and drops to a throwaway uid (`root.py`); as any other user
bubblewrap builds them in a user namespace (`bwrap.py`) and the same launcher runs inside.

Threat model: damage is contained, and a pass cannot be forged from inside the program's
process: the tests run in another process of the run (the judge), which calls the program's
functions with plain data and compares the plain data they return, and which alone holds the
tests and the report descriptor; no process of the run can read another's memory
(`launcher.py`).
"""

from art_rlvr.scenarios.rewards.sandbox.root import sandbox_processes
from art_rlvr.scenarios.rewards.sandbox.run import (
    RunResult,
    SandboxChoice,
    SandboxUnavailable,
    Tests,
    choose_sandbox,
    run_sandboxed,
    sandbox_problem,
    sandbox_unavailable_reason,
)
from art_rlvr.scenarios.rewards.sandbox.spec import LAUNCHER, SandboxKind, SandboxLimits

__all__ = [
    "LAUNCHER",
    "RunResult",
    "SandboxChoice",
    "SandboxKind",
    "SandboxLimits",
    "SandboxUnavailable",
    "Tests",
    "choose_sandbox",
    "run_sandboxed",
    "sandbox_problem",
    "sandbox_processes",
    "sandbox_unavailable_reason",
]
