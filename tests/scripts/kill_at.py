"""Run the CLI (`python -m art_rlvr.run ...`), SIGKILLing it just before its N-th write into
the run folder, or listing those writes; for tests/loops/test_kill_windows.py.

    python tests/scripts/kill_at.py RUN_DIR (--trace FILE | --kill-at REGEX N) -- key=value ...

A write is an `open` for writing, a rename or replace, a removal, a `mkdir` or an `rmtree` of a
path under RUN_DIR, seen through Python's audit hooks (they fire before the operation), so a
kill before the N-th write whose description (`os.rename state.json`, `open metrics.jsonl`)
matches REGEX leaves the folder exactly as a crash between that write and the one before.
"""

from __future__ import annotations

import os
import re
import runpy
import signal
import sys
from pathlib import Path

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def written(event: str, args: tuple, root: str) -> str | None:
    """`event path` for a write under `root`, else None."""
    if event == "open":
        path, mode, flags = args
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else flags & WRITE_FLAGS
        targets = [path] if writes else []
    elif event == "os.rename":
        targets = [args[1]]
    elif event in ("os.remove", "os.mkdir", "shutil.rmtree", "os.truncate"):
        targets = [args[0]]
    else:
        return None
    for target in targets:
        if isinstance(target, str | bytes | os.PathLike):
            text = os.path.abspath(os.fsdecode(target))
            if text.startswith(root):
                return f"{event} {os.path.relpath(text, root)}"
    return None


def main() -> None:
    split = sys.argv.index("--")
    root = str(Path(sys.argv[1]).resolve())
    words = sys.argv[split + 1 :]
    trace = open(sys.argv[3], "a") if sys.argv[2] == "--trace" else None  # noqa: SIM115
    pattern = re.compile(sys.argv[3]) if trace is None else None
    target = int(sys.argv[4]) if trace is None else 0
    count = 0

    def hook(event: str, args: tuple) -> None:
        nonlocal count
        what = written(event, args, root)
        if what is None:
            return
        if trace is not None:
            trace.write(f"{what}\n")
            trace.flush()
        elif pattern is not None and pattern.search(what):
            count += 1
            if count == target:
                os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    sys.argv = ["art_rlvr.run", *words, f"run_dir={root}"]
    runpy.run_module("art_rlvr.run", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
