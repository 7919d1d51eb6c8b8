"""A solution is bounded in total: all its processes' memory (SysV shared memory and memfd
included) and their number, measured from outside (`art_rlvr/testing/bombs.py`: a measuring
cgroup around a scorer process, which also bounds the case), in both sandboxes as root.

Before per-run cgroups (main e6a4417), at memory_mb=128: eight forked children held ~900 MB,
detached SysV segments and unmapped memfd files reached the measuring cgroup's cap, and under
bubblewrap as root a fork bomb reached its 2,000 tasks (RLIMIT_NPROC does not count root's).
As uid 65534, see test_sandbox_unprivileged.py (the fallback, without cgroups).
"""

from __future__ import annotations

import json
import sys

import pytest

from art_rlvr.scenarios.rewards.sandbox import sandbox_problem
from art_rlvr.scenarios.rewards.sandbox.cgroups import (
    HARNESS_MB,
    HARNESS_TASKS,
    Hierarchy,
    cgroup_hierarchy,
)
from art_rlvr.testing.bombs import BOMBS, TASK, Held, held, measurable

MEMORY_MB, MAX_PROCESSES, TIMEOUT_S = 128, 8, 2.0
SCORE = """
import asyncio, json, sys, time
from art_rlvr.scenarios.rewards.code import CodeReward
from art_rlvr.scenarios.rewards.sandbox import choose_sandbox
kind, case = sys.argv[1], json.loads(sys.argv[2])
reward = CodeReward(sandbox=kind, limits=case["limits"])
choose_sandbox(kind)  # the sandbox's own check runs before the clock starts
started = time.monotonic()
score = asyncio.run(reward(case["task"], case["body"]))
print(json.dumps({"reward": score.reward, "feedback": score.feedback,
                  "seconds": time.monotonic() - started}))
"""

pytestmark = [
    pytest.mark.skipif(measurable() is not None, reason=str(measurable())),
    pytest.mark.skipif(
        not isinstance(cgroup_hierarchy(), Hierarchy), reason=str(cgroup_hierarchy())
    ),
]


def score_in_cgroup(kind: str, bomb: str) -> tuple[Held, dict]:
    limits = {"memory_mb": MEMORY_MB, "max_processes": MAX_PROCESSES, "timeout_s": TIMEOUT_S}
    case = json.dumps({"task": TASK, "body": BOMBS[bomb], "limits": limits})
    result = held([sys.executable, "-c", SCORE, kind, case], cap_mb=1536, max_tasks=1000)
    assert result.returncode == 0, result.stderr[-2000:]
    return result, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def baseline() -> dict[str, Held]:
    """What scoring a trivial solution peaks at, per sandbox (the scorer's own process)."""
    return {
        kind: score_in_cgroup(kind, "trivial")[0]
        for kind in ("root", "bwrap")
        if sandbox_problem(kind) is None
    }


@pytest.mark.parametrize("kind", ["root", "bwrap"])
@pytest.mark.parametrize("bomb", ["fork_memory", "sysv_shm", "memfd", "fork_memfd", "fork_bomb"])
def test_a_bomb_holds_at_most_the_limits_in_total(
    kind: str, bomb: str, baseline: dict[str, Held]
) -> None:
    if kind not in baseline:
        pytest.skip(str(sandbox_problem(kind)))
    result, score = score_in_cgroup(kind, bomb)
    base = baseline[kind]
    assert result.oom_kills == 0  # the measuring cgroup's cap was never reached
    assert result.peak_mb - base.peak_mb <= MEMORY_MB + HARNESS_MB + 16, result
    assert result.peak_tasks - base.peak_tasks <= MAX_PROCESSES + HARNESS_TASKS, result
    assert score["reward"] == 0.0
    assert score["seconds"] < TIMEOUT_S + 3, score
