"""Run untrusted Python against its tests in a throwaway sandbox.

Model-written code is hostile by default. Each run happens in a fresh process tree that:

- lives in new mount, PID, network, IPC and UTS namespaces (so: no network at all, it sees only
  its own processes, and everything in it dies when its init process exits);
- has a read-only root holding only /usr, the Python install and four /dev nodes, with a
  writable, size-limited tmpfs at /tmp/work (the host's home, /tmp, /work... are absent);
- runs unprivileged with no_new_privs and resource limits (address space, CPU seconds, process
  count, file size, open files), and an environment built from nothing;
- is killed as a whole on a wall-clock timeout or when its output passes a cap.

Two ways to build it, picked by `choose_sandbox`: as root the launcher (`launcher.py`, run by
path) builds the namespaces itself and drops to a throwaway uid (`root.py`); as any other user
bubblewrap builds them in a user namespace (`bwrap.py`) and the same launcher runs inside.

Threat model: damage is contained; a program that deliberately forges the harness's reports
from inside its own process could still fake a pass (the per-run nonce makes that take intent).
"""

from art_rlvr.rewards.sandbox.root import sandbox_processes
from art_rlvr.rewards.sandbox.run import (
    RunResult,
    SandboxChoice,
    SandboxUnavailable,
    choose_sandbox,
    run_sandboxed,
    sandbox_problem,
    sandbox_unavailable_reason,
)
from art_rlvr.rewards.sandbox.spec import LAUNCHER, SandboxKind, SandboxLimits

__all__ = [
    "LAUNCHER",
    "RunResult",
    "SandboxChoice",
    "SandboxKind",
    "SandboxLimits",
    "SandboxUnavailable",
    "choose_sandbox",
    "run_sandboxed",
    "sandbox_problem",
    "sandbox_processes",
    "sandbox_unavailable_reason",
]
