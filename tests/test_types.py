"""The type checker and the linter as part of the suite: mypy on the package finds no error,
ruff finds nothing to fix or reformat anywhere in the repository (notebooks included).

Its settings are pyproject's `[tool.mypy]` (strict on `art_rlvr.core.types`, the default level
elsewhere); the same check alone is `uv run mypy`. It keeps its cache in the repository's
`.mypy_cache` (ignored by git): a fresh clone pays for a cold run once, later runs are quick.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_no_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-color-output", "--no-error-summary"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"mypy (exit {done.returncode}):\n{done.stdout}{done.stderr}"
    assert done.stdout.strip() == "", done.stdout  # no note or warning either


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]])
def test_ruff_is_clean(command: list[str]) -> None:
    """pyproject's `[tool.ruff]` over everything ruff reads, as `uv run ruff ...` does."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"ruff {' '.join(command)}:\n{done.stdout}{done.stderr}"
