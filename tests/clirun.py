"""Run the CLI from a test: `python -m art_rlvr.run ARGS` in-process or in its own process.

Not a test file: tests in any folder import it (`from clirun import base_env, cli`); pytest
puts `tests/` on the path for its rootdir conftest."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout


def cli(
    args: list[str], env: dict[str, str], *, own_process: bool = False
) -> subprocess.CompletedProcess[str]:
    """`python -m art_rlvr.run ARGS` with exactly `env`: in a process of its own, or through
    `main` here (environment, root logger and stdio put back afterwards)."""
    if own_process:
        command = [sys.executable, "-m", "art_rlvr.run", *args]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    from art_rlvr.run import main

    saved, root = dict(os.environ), logging.getLogger()
    handlers, level = list(root.handlers), root.level
    out, err = io.StringIO(), io.StringIO()
    os.environ.clear()
    os.environ.update(env)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main(args)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        for handler in list(root.handlers):  # the run's log handlers (run.log among them)
            root.removeHandler(handler)
            if handler not in handlers:
                handler.close()
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    return {**env, **extra}
