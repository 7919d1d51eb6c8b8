"""The walk of one RL step through the package: which art_rlvr modules it passes, how many
calls cross from one module to another, and how many climb back up the layers (a callee in a
higher layer than its caller, as `tests/test_layers.py` orders them: a decorator calling the
function it wraps, a callback into user code, a generator handed down and pulled from below).

Runs a 1-step RL run of the default scenario in this process under a profiler and watches
from the first call of `rl_step` until the step is booked. Works on any checkout with a
`tests/test_layers.py` (so an older commit can be walked for a before/after):

    uv run python benchmarks/rl_step_walk.py --out walk.json [--repo PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import runpy
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from types import FrameType, ModuleType

BOOKING = ("record_step", "book_step", "book")  # the step is done when one of these starts


def load_layers(repo: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("layers", repo / "tests" / "test_layers.py")
    assert spec is not None and spec.loader is not None
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    return layers


class Walk:
    """A profiler hook that records (caller module, callee module) for every call of an
    art_rlvr function between the start of `rl_step` and the booking of its step."""

    def __init__(self) -> None:
        self.on = False
        self.done = False
        self.calls: list[tuple[str, str]] = []

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or self.done:
            return
        name = str(frame.f_globals.get("__name__", ""))
        if not name.startswith("art_rlvr"):
            return
        code = frame.f_code.co_name
        if code == "rl_step":
            self.on = True
        elif self.on and code in BOOKING:
            self.done = True
            return
        if self.on:
            back = frame.f_back
            caller = str(back.f_globals.get("__name__", "")) if back is not None else ""
            self.calls.append((caller, name))


def summary(calls: list[tuple[str, str]], layers: ModuleType) -> dict[str, object]:
    def layer(module: str) -> int | None:
        try:
            return int(layers.layer_of(module))
        except AssertionError:
            return None

    inside = [(a, b) for a, b in calls if a.startswith("art_rlvr") and a != b]
    climbs = Counter(
        (a, b)
        for a, b in inside
        if (la := layer(a)) is not None and (lb := layer(b)) is not None and lb < la
    )
    modules = list(dict.fromkeys(b for _, b in calls))
    return {
        "modules": modules,
        "n_modules": len(modules),
        "calls": len(calls),
        "cross_module_calls": len(inside),
        "climbs": sum(climbs.values()),
        "climb_pairs": {f"{a} -> {b}": n for (a, b), n in climbs.most_common()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    layers = load_layers(args.repo)
    walk = Walk()
    with tempfile.TemporaryDirectory() as tmp:
        sys.argv = ["art_rlvr.run", "scenario=arith", "n_batches=1", "val_limit=2",
                    "eval_test=false", f"run_dir={tmp}/run", "log_level=WARNING"]  # fmt: skip
        sys.setprofile(walk)
        threading.setprofile(walk)
        try:
            runpy.run_module("art_rlvr.run", run_name="__main__")
        except SystemExit:
            pass
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
    result = summary(walk.calls, layers)
    args.out.write_text(json.dumps(result, indent=1))
    shown = {k: v for k, v in result.items() if k != "modules"}
    print(json.dumps(shown, indent=1))


if __name__ == "__main__":
    main()
