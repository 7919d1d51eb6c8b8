"""The unprivileged sandbox, run by a real unprivileged user: the hostile table is contained
and HumanEval's canonical solutions score 1.0.

As root, the test creates a throwaway user and runs this file as a script dropped to that user
(`drop_to`, then `child`); the child runs the checks with the automatic sandbox choice (which
must be bubblewrap for a non-root user) and prints what it saw as JSON; the assertions run here,
the same ones as the root sandbox's (test_rewards_code.py). Run by an ordinary user instead,
test_rewards_code.py itself runs on the unprivileged sandbox.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_rewards_code import (
    HOSTILE,
    assert_contained,
    humaneval_tasks,
    observe_hostile,
    settled,
)

from art_rlvr.scenarios.rewards.base import RewardConfigError
from art_rlvr.scenarios.rewards.code import CodeReward, code
from art_rlvr.scenarios.rewards.sandbox import bwrap, choose_sandbox, sandbox_problem
from art_rlvr.scenarios.rewards.sandbox.cgroups import HARNESS_MB
from art_rlvr.testing.bombs import BOMBS, TASK, held, measurable

HERE = Path(__file__).resolve()
TOOLS = ("useradd", "userdel", "mount")

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="creating a user to drop to needs root (as an ordinary user, "
        "test_rewards_code.py already runs on the unprivileged sandbox)",
    ),
    pytest.mark.skipif(not all(shutil.which(t) for t in TOOLS), reason=f"needs {', '.join(TOOLS)}"),
    pytest.mark.skipif(sandbox_problem("bwrap") is not None, reason=str(sandbox_problem("bwrap"))),
]


# --- as root: a user, a view of the Python install it can reach, the drop ---------------------


def owned_by(uid: int) -> list[int]:
    """Live processes of `uid`. Not zombies: bwrap leaves its namespace's init, dead, to the
    host's init to reap, which may take a moment."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and entry.stat().st_uid == uid
                and (entry / "stat").read_text().rpartition(")")[2].split()[0] != "Z"
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def user() -> Iterator[pwd.struct_passwd]:
    name = f"artsbx{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--create-home", "--user-group", "--shell", "/usr/sbin/nologin", name],
        check=True,
    )
    account = pwd.getpwnam(name)
    try:
        yield account
    finally:
        for pid in owned_by(account.pw_uid):  # only this test's user: nothing else runs as it
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["userdel", "--remove", name], capture_output=True)


def closed_top(path: Path) -> Path | None:
    """The outermost directory on the way to `path` that other users cannot enter."""
    for parent in reversed(path.parents):
        if not parent.stat().st_mode & 0o001:
            return parent
    return None


def open_view(paths: list[Path]) -> None:
    """In a new private mount namespace, make `paths` reachable by every user: each directory
    on their way that others cannot enter (a pyenv install under /root, say) is covered by a
    0755 tmpfs holding only these paths, bound back in. Nothing on the host changes."""
    os.unshare(os.CLONE_NEWNS)
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    outermost = [p for p in paths if not any(q in p.parents for q in paths)]
    by_top: dict[Path, list[Path]] = {}
    for path in outermost:
        if (top := closed_top(path)) is not None:
            by_top.setdefault(top, []).append(path)
    for top, inner in by_top.items():
        stash = Path(tempfile.mkdtemp())
        for index, path in enumerate(inner):
            (stash / str(index)).mkdir()
            subprocess.run(["mount", "--rbind", path, stash / str(index)], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "view", top], check=True)
        for index, path in enumerate(inner):
            path.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "--move", stash / str(index), path], check=True)
        shutil.rmtree(stash)


def drop_to(name: str, userns: bool, args: list[str]) -> None:
    """(root) Open the view, become `name` for good, run this file's `child` with `args`;
    without `userns`, inside a bwrap that forbids new user namespaces, as hardened hosts do."""
    account = pwd.getpwnam(name)
    needed = [Path(sys.base_prefix).resolve(), Path(sys.prefix), HERE.parents[2]]
    open_view(needed)
    os.initgroups(name, account.pw_gid)
    os.setgid(account.pw_gid)
    os.setuid(account.pw_uid)
    os.chdir(account.pw_dir)
    command = [sys.executable, str(HERE), "child", *args]
    if not userns:
        jail = ["--unshare-user", "--disable-userns", "--unshare-pid", "--bind", "/", "/"]
        jail += ["--dev", "/dev", "--proc", "/proc", "--"]
        command = [str(bwrap.bwrap_binary()), *jail, *command]
    os.execv(command[0], command)


def user_env(account: pwd.struct_passwd) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": account.pw_dir,
        "LANG": "C.UTF-8",
        "OPENAI_API_KEY": f"sk-fake-artrlvr-{secrets.token_hex(8)}",
    }


def run_as(
    account: pwd.struct_passwd, args: list[str], timeout: float, userns: bool = True
) -> dict:
    done = subprocess.run(
        [sys.executable, str(HERE), "drop", account.pw_name, str(userns), *args],
        env=user_env(account),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- as the user -------------------------------------------------------------------------------


def mine_in_a_sandbox() -> list[int]:
    """My processes in a PID namespace other than mine: what a sandbox holds."""
    own = os.readlink("/proc/self/ns/pid")
    found = []
    for pid in owned_by(os.getuid()):
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") != own:
                found.append(pid)
        except OSError:
            continue
    return found


def mine_but_me() -> list[int]:
    return [pid for pid in owned_by(os.getuid()) if pid != os.getpid()]


async def child_hostile(home: str, outside: str, names: list[str]) -> dict:
    return {
        "kind": choose_sandbox(),
        "seen": {
            name: await observe_hostile(
                name, Path(home), Path(outside), "auto", mine_in_a_sandbox, mine_but_me
            )
            for name in names
        },
    }


async def child_humaneval(indices: list[str]) -> dict:
    tasks = [humaneval_tasks()[int(i)] for i in indices]
    reward = code()
    started = time.monotonic()
    scores = await asyncio.gather(*(reward(t, t["canonical_solution"]) for t in tasks))
    return {
        "kind": choose_sandbox(reward.sandbox),
        "seconds": time.monotonic() - started,
        "scored": len(scores),
        "failed": {
            t["task_id"]: s.feedback for t, s in zip(tasks, scores, strict=True) if s.reward < 1
        },
        "leftovers": await settled(mine_but_me),
    }


BOMB_LIMITS = {"memory_mb": 128, "max_processes": 8, "timeout_s": 2.0}


async def child_bomb(name: str) -> dict:
    score = await CodeReward(limits=BOMB_LIMITS)(TASK, BOMBS[name])
    return {"reward": score.reward, "feedback": score.feedback}


def child_no_sandbox() -> dict:
    try:
        code()
    except RewardConfigError as error:
        return {"error": str(error)}
    return {"error": None}


def child(what: str, args: list[str]) -> None:
    assert os.geteuid() != 0, "the child must run unprivileged"
    if what == "hostile":
        seen = asyncio.run(child_hostile(args[0], args[1], args[2:]))
    elif what == "humaneval":
        seen = asyncio.run(child_humaneval(args))
    elif what == "bomb":
        seen = asyncio.run(child_bomb(args[0]))
    else:
        seen = child_no_sandbox()
    print(json.dumps(seen))


# --- the tests -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def escape_paths(user: pwd.struct_passwd) -> Iterator[tuple[Path, Path]]:
    """A path in the user's home and one in a directory the user may write, outside /tmp/work."""
    writable = Path(tempfile.mkdtemp(prefix="art-rlvr-user-"))
    os.chown(writable, user.pw_uid, user.pw_gid)
    home = Path(user.pw_dir) / f"art-rlvr-escape-{secrets.token_hex(4)}"
    yield home, writable / "escape" / "pwned.txt"
    shutil.rmtree(writable)


@pytest.fixture(scope="module")
def hostile_seen(user: pwd.struct_passwd, escape_paths: tuple[Path, Path]) -> dict:
    """The whole table, run once by the user (10-15 s)."""
    home, outside = escape_paths
    return run_as(user, ["hostile", str(home), str(outside), *HOSTILE], timeout=300)


def test_the_user_gets_the_unprivileged_sandbox(hostile_seen: dict) -> None:
    assert hostile_seen["kind"] == "bwrap"


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_programs_are_contained_unprivileged(
    name: str, hostile_seen: dict, escape_paths: tuple[Path, Path]
) -> None:
    assert_contained(name, hostile_seen["seen"][name], *escape_paths)


def test_humaneval_canonical_solutions_all_pass_unprivileged(user: pwd.struct_passwd) -> None:
    """9-17 s on 2 busy cores, about the root sandbox's time for the same 164."""
    seen = run_as(user, ["humaneval", *map(str, range(164))], timeout=300)
    assert seen["kind"] == "bwrap"
    assert seen["scored"] == 164 and seen["failed"] == {}
    assert seen["leftovers"] == []
    print(f"\n164 HumanEval canonical solutions as a user: {seen['seconds']:.1f} s")


def bomb_held(account: pwd.struct_passwd, bomb: str) -> tuple[float, int, dict]:
    """(MB, tasks) scoring one bomb as the user peaked at, measured from outside; the score."""
    command = [sys.executable, str(HERE), "drop", account.pw_name, "True", "bomb", bomb]
    result = held(command, cap_mb=1536, max_tasks=1000, env=user_env(account))
    assert result.returncode == 0 and result.oom_kills == 0, result.stderr[-2000:]
    return result.peak_mb, result.peak_tasks, json.loads(result.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def trivial_peak(user: pwd.struct_passwd) -> tuple[float, int, dict]:
    return bomb_held(user, "trivial")


FALLBACK = [  # without cgroups: the tree's memory watched in total, no shared memory at all
    # the watch's limit and what a burst faults in before it is seen (at most 216 MB held
    # beside a busy loop per core, 2026-12-02); 8 x 128 MB per process before the watch
    ("fork_memory", BOMB_LIMITS["memory_mb"] + HARNESS_MB + 128),
    ("sysv_shm", 32),
    ("memfd", 32),
    ("fork_memfd", 32),
    ("fork_bomb", 32),
]


@pytest.mark.skipif(measurable() is not None, reason=str(measurable()))
@pytest.mark.parametrize(("bomb", "most_mb"), FALLBACK)
def test_the_fallback_bounds_bombs_as_a_user(
    user: pwd.struct_passwd, trivial_peak: tuple[float, int, dict], bomb: str, most_mb: int
) -> None:
    """As a user no cgroup can be made: memory_mb bounds each process and, watched, the tree's
    resident memory in total; max_processes their number; SysV shared memory and memfd are
    refused. Before (main e6a4417) a detached SysV segment or an unmapped memfd file reached
    the measuring cgroup's cap here, and (752bf27) seven forked children held 772 MB."""
    mb, tasks, score = bomb_held(user, bomb)
    mb, tasks = mb - trivial_peak[0], tasks - trivial_peak[1]
    assert mb <= most_mb, (mb, score)
    assert tasks <= BOMB_LIMITS["max_processes"] + 3, (tasks, score)  # + bwrap's init, ours
    assert score["reward"] == 0.0


def test_without_user_namespaces_the_reward_says_why(user: pwd.struct_passwd) -> None:
    error = run_as(user, ["no-sandbox"], timeout=120, userns=False)["error"]
    assert error.startswith("reward 'code': no code sandbox can run here")
    assert "root sandbox: it needs root" in error
    assert "bwrap sandbox: a trivial run failed" in error and "user namespaces" in error


if __name__ == "__main__":
    if sys.argv[1] == "drop":
        drop_to(sys.argv[2], sys.argv[3] == "True", sys.argv[4:])
    else:
        child(sys.argv[2], sys.argv[3:])
