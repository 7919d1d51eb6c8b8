"""CPU time, next to wall time in every metrics event: on a shared machine wall time drifts
with the neighbours' load, while CPU seconds measure what the run itself spent."""

from __future__ import annotations

import resource


def cpu_seconds() -> float:
    """User + system CPU of this process and of the child processes it has waited for (the
    code sandboxes; long-lived worker pools count only once they exit)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
