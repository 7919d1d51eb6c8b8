"""What a hostile solution can hold inside the code sandbox: memory (anonymous, SysV shared
memory, memfd, across forked children) and processes, as root and as uid 65534.

    sudo uv run python benchmarks/sandbox_bombs.py [--kinds root,bwrap] [--users root,nobody]
        [--bombs memory,fork_memory,sysv_shm,memfd,fork_memfd,fork_bomb] [--code DIR]
        [--memory-mb 128] [--timeout-s 6] [--cap-mb 2048] [--json out.json]

Needs root and cgroup v1: each case scores one bomb (`art_rlvr/testing/bombs.py`) in a process
of its own inside a measuring cgroup (`bombs.held`: memory capped at `--cap-mb`, 2,000 tasks),
which reports the peak memory charged and the peak number of tasks, less those of a trivial
solution scored the same way, and bounds the case: a figure at the cap means "unbounded;
stopped by the benchmark's cgroup". As "nobody" the scorer runs as uid 65534 in a private mount
namespace where the Python install is reachable (a pyenv under /root, say); nothing on the
host changes. `--code DIR` scores with the art_rlvr of another checkout (e.g. an older commit
unpacked with `git archive <commit> art_rlvr | tar -x -C DIR`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path


def one(kind: str, case: str, memory_mb: int, timeout_s: float) -> None:
    """(in the measuring cgroup, maybe with another checkout's art_rlvr) Score one bomb, given
    as JSON {"task", "body"}; print what came back as JSON."""
    from art_rlvr.scenarios.rewards.code import CodeReward

    reward = CodeReward(limits={"memory_mb": memory_mb, "timeout_s": timeout_s}, sandbox=kind)
    given = json.loads(case)
    started = time.monotonic()
    score = asyncio.run(reward(given["task"], given["body"]))
    seconds = round(time.monotonic() - started, 2)
    print(json.dumps({"reward": score.reward, "feedback": score.feedback, "seconds": seconds}))


def nobody_prefix() -> list[str]:
    """A command prefix: a private mount namespace in which the Python install is reachable by
    every user (each closed directory on its way covered by a 0755 tmpfs holding only it),
    then uid/gid 65534."""
    script = ""
    for index, path in enumerate(sorted({str(Path(p).resolve()) for p in (sys.base_prefix,)})):
        closed = [q for q in reversed(Path(path).parents) if not q.stat().st_mode & 0o001]
        if closed:
            script += (
                f"S=$(mktemp -d); mount --rbind {path} $S; "
                f"mount -t tmpfs -o mode=0755 v{index} {closed[0]}; "
                f"mkdir -p {path}; mount --move $S {path}; "
            )
    setpriv = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            script + 'exec "$@"', "sh", *setpriv]  # fmt: skip


def measure(args: argparse.Namespace, kind: str, user: str, bomb: str) -> dict:
    from art_rlvr.testing.bombs import BOMBS, TASK, held

    prefix = nobody_prefix() if user == "nobody" else []
    case = json.dumps({"task": TASK, "body": BOMBS[bomb]})
    script = [sys.executable, str(Path(__file__).resolve()), "--one", kind, case]
    script += ["--memory-mb", str(args.memory_mb), "--timeout-s", str(args.timeout_s)]
    env = f"PYTHONPATH={args.code.resolve()}" if args.code else "PYTHONNOUSERSITE=1"
    command = ["env", env, f"HOME={tempfile.gettempdir()}", *prefix, *script]
    result = held(command, cap_mb=args.cap_mb)
    lines = result.stdout.strip().splitlines()
    said = json.loads(lines[-1]) if result.returncode == 0 and lines else {}
    error = {} if said else {"error": (result.stderr or result.stdout)[-300:]}
    return {"kind": kind, "user": user, "bomb": bomb, **result.model_dump(exclude={"stdout", "stderr"}),
            **said, **error}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--one", nargs=2, metavar=("KIND", "CASE"), help=argparse.SUPPRESS)
    parser.add_argument("--kinds", default="root,bwrap")
    parser.add_argument("--users", default="root,nobody")
    parser.add_argument("--bombs", default="memory,fork_memory,sysv_shm,memfd,fork_memfd,fork_bomb")
    parser.add_argument("--code", type=Path, help="a checkout whose art_rlvr scores")
    parser.add_argument("--memory-mb", type=int, default=128, help="the sandbox's memory_mb")
    parser.add_argument("--timeout-s", type=float, default=6.0, help="the sandbox's timeout_s")
    parser.add_argument("--cap-mb", type=int, default=2048, help="the benchmark's own cap")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.one:
        one(*args.one, memory_mb=args.memory_mb, timeout_s=args.timeout_s)
        return
    from art_rlvr.testing.bombs import measurable

    if (problem := measurable()) or not shutil.which("setpriv"):
        raise SystemExit(problem or "needs setpriv (util-linux) on PATH")
    os.chdir(tempfile.gettempdir())  # so that the checkout's art_rlvr is not found by cwd
    rows = []
    for user in args.users.split(","):
        for kind in args.kinds.split(","):
            if user == "nobody" and kind == "root":
                continue  # the root sandbox needs root
            base = measure(args, kind, user, "trivial")
            for bomb in args.bombs.split(","):
                row = measure(args, kind, user, bomb)
                row["held_mb"] = round(row["peak_mb"] - base["peak_mb"], 1)
                row["held_tasks"] = row["peak_tasks"] - base["peak_tasks"]
                rows.append(row)
                print(
                    f"{user:6} {kind:5} {bomb:12} held {row['held_mb']:7.1f} MB "
                    f"{row['held_tasks']:5d} extra tasks  cap hit {row['oom_kills']}  "
                    f"{row.get('seconds', '?')} s  reward {row.get('reward')}  "
                    f"{(row.get('feedback') or row.get('error', ''))[:90]!r}",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
