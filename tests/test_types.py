"""The type checker and the linter as part of the suite: mypy on the package finds no error,
ruff finds nothing to fix or reformat anywhere in the repository (notebooks included).

Their settings are pyproject's `[tool.mypy]` (strict on `art_rlvr.core.types`, the default level
elsewhere) and `[tool.ruff]`; the same checks alone are `uv run mypy` and `uv run ruff ...`.
mypy keeps its cache in the repository's `.mypy_cache` (ignored by git): a fresh clone pays
for a cold run once, later runs are quick.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tool(*args: str, timeout: int) -> subprocess.CompletedProcess[str]:
    """`python -m <args>` in the repository, its output kept for the failure message."""
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_mypy_finds_no_error() -> None:
    done = tool("mypy", "--no-color-output", "--no-error-summary", timeout=600)
    assert done.returncode == 0, f"mypy (exit {done.returncode}):\n{done.stdout}{done.stderr}"
    assert done.stdout.strip() == "", done.stdout  # no note or warning either


@pytest.mark.parametrize("command", [("check", "."), ("format", "--check", ".")])
def test_ruff_is_clean(command: tuple[str, ...]) -> None:
    done = tool("ruff", *command, timeout=300)
    assert done.returncode == 0, f"ruff {' '.join(command)}:\n{done.stdout}{done.stderr}"
