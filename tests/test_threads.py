"""OpenMP spinning: `import art_rlvr` shortens it unless the user chose (art_rlvr/__init__.py)."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(("given", "seen"), [(None, "1000"), ("300000", "300000"), ("0", "0")])
def test_gomp_spincount_defaults_to_1000_and_keeps_the_users(given, seen) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if given is not None:
        env["GOMP_SPINCOUNT"] = given
    code = "import os, art_rlvr; print(os.environ['GOMP_SPINCOUNT'])"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == seen
