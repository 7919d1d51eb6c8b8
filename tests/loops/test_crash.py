"""SIGKILL at random points of every mode, over seeds, then resume: the finished run equals an
uninterrupted one (same summary, same checkpoints, no training step logged twice, every state
file parses). Slow: about 15 minutes on 2 cores (`uv run pytest -m slow tests/loops/test_crash.py`)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from art_rlvr.testing import ScriptedServer, Step

KEY = "sk-crash-test"
SEED_PROMPT = "Answer the question."
GOOD = "Reply with a bare number and nothing else."
COMMON = [
    "scenario=arith",
    f"system_prompt={SEED_PROMPT}",
    "max_tokens=8",
    "val_limit=4",
    "eval_test=false",
    "groups_per_batch=2",
    "group_size=2",
    "learning_rate=1e-4",
]
REFLECTOR = [
    "reflection.model=openai/scripted",
    "reflection.api_key_env=CRASH_KEY",
    "reflection.backoff_s=0.01",
    "pareto_size=4",
    "traces_per_iteration=2",
    "gepa.group_size=1",
    "min_improvement_threshold=-1",
]
MODES: dict[str, list[str]] = {
    "rl": ["mode=rl", "n_batches=4", "eval_every=2"],
    "gepa": ["mode=gepa", *REFLECTOR, "max_metric_calls=24", "max_iterations=3",
             "report_val_limit=4"],
    "ei": ["mode=ei", "rounds=2", "scenarios_per_round=4",
           "eval_every_rounds=1"],
    "gepa_rl_ei": ["mode=gepa_rl_ei", *REFLECTOR, "rounds=1", "rl_batches_per_round=2",
                   "scenarios_per_round=4", "max_metric_calls=16",
                   "max_iterations=1"],
}  # fmt: skip
VOLATILE = {"wall_seconds", "peak_rss_mb", "seconds_per_step_median", "rollouts"}
SEEDS = [0, 1, 2]


def argv(mode: str, run_dir: Path, server: ScriptedServer) -> list[str]:
    words = [*COMMON, *MODES[mode], f"run_dir={run_dir}"]
    if any(w.startswith("reflection.model=") for w in words):
        words.append(f"reflection.api_base={server.base_url}")
    return [sys.executable, "-m", "art_rlvr.run", *words]


def outcome(run_dir: Path) -> dict[str, Any]:
    """What must not depend on kills: the summary (less clocks), checkpoints, step log."""
    summary = json.loads((run_dir / "summary.json").read_text())
    states = [p for p in run_dir.rglob("*.json") if ".art" not in p.parts]
    assert run_dir / "summary.json" in states and len(states) > 2, states
    for state in states:
        json.loads(state.read_text())  # every state file parses
    for log in [p for p in run_dir.rglob("*.jsonl") if ".art" not in p.parts]:
        [json.loads(line) for line in log.read_text().splitlines()]  # and every log line
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if r.get("event") == "train"]
    assert steps == sorted(set(steps)), f"a training step was logged twice: {steps}"
    checkpoints = sorted(p.name for p in run_dir.glob(".art/*/models/*/checkpoints/*"))
    return {
        "summary": {k: v for k, v in summary.items() if k not in VOLATILE},
        "checkpoints": checkpoints,
        "steps": steps,
    }


def run(command: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return time.monotonic() - started


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, float]]:
    """Each mode once, uninterrupted: its outcome and its duration (to place the kills)."""
    env = {**os.environ, "CRASH_KEY": KEY}
    out = {}
    for mode in MODES:
        run_dir = tmp_path_factory.mktemp(f"ref-{mode}")
        with ScriptedServer([], default=Step.reply(f"Better:\n```\n{GOOD}\n```")) as server:
            seconds = run(argv(mode, run_dir, server), env)
        out[mode] = (outcome(run_dir), seconds)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", list(MODES))
def test_random_sigkills_resume_to_the_uninterrupted_result(
    references: dict[str, tuple[dict, float]], tmp_path: Path, mode: str, seed: int
) -> None:
    reference, seconds = references[mode]
    rng = random.Random(f"{mode}:{seed}")
    env = {**os.environ, "CRASH_KEY": KEY}
    kills = rng.choice([1, 2])
    fractions = [rng.uniform(0.1, 0.9) for _ in range(kills)]
    landed: list[float] = []
    with ScriptedServer([], default=Step.reply(f"Better:\n```\n{GOOD}\n```")) as server:
        # the machine's load changes run times: if a run ends before its first kill, start
        # again in a fresh folder with the kill points scaled down, so kills always land
        for attempt in range(4):
            run_dir = tmp_path / f"attempt{attempt}"
            command = argv(mode, run_dir, server)
            for fraction in fractions:
                delay = fraction * seconds * 0.6**attempt
                proc = subprocess.Popen(
                    command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                try:
                    proc.wait(timeout=delay)
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    landed.append(round(delay, 1))
                else:
                    assert proc.returncode == 0, (
                        f"{mode} failed on its own (exit {proc.returncode})"
                    )
            if landed:
                break
        run(command, env)
    print(f"{mode} seed {seed}: killed at {landed} s of a {seconds:.0f} s run")
    assert landed, "no kill landed before the run finished"
    assert outcome(run_dir) == reference, f"killed at {landed} s"
