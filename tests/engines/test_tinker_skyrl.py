"""`backend=tinker` end to end against a real SkyRL engine on loopback, set up as
docs/scaling.md tells a user: the engine from `art_rlvr.backend.external.skyrl` (SkyRL 0.4.0 in its own
uv environment, the embedded model, JAX on CPU), the run in the tinker extra's environment
through `UV_PROJECT_ENVIRONMENT=.venv-tinker uv run --locked --extra tinker --no-dev python -m
art_rlvr.run backend=tinker ...`, which talks to it through ART's TinkerNativeBackend and the
tinker SDK.

Slow (about 25 minutes on 2 idle cores, most of it SkyRL's sampling and JAX compiling new
shapes; `uv run pytest -m slow tests/engines/test_tinker_skyrl.py`): RL steps train, score and
resume; eval, GEPA and expert iteration run; a run against an engine serving another model,
and a run whose engine dies, each stop with one line; the killed run resumes on a restarted
engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from art_rlvr.backend.external import skyrl
from art_rlvr.rundir.stored import read_trajectories
from art_rlvr.testing.scripted_server import ScriptedServer, Step

# Each test runs one to three whole runs (one took 404 s idle, two to three times that under
# load): the suite's 900 s per test cut them off mid-run (2026-12-02), so each gets an hour.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "backend=tinker",
    "scenario=arith",
    "groups_per_batch=2",
    "group_size=4",
    "val_limit=4",
    "eval_test=false",
]
BETTER = "Reply with the number only, e.g. 12."


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("skyrl-state")


@pytest.fixture(scope="module")
async def engine(state: Path):
    running = await skyrl.start(skyrl.SkyRLSettings(port=0, state_dir=state))
    yield running
    await running.stop()


def tinker_command(words: list[str]) -> list[str]:
    """The documented command (docs/scaling.md), as a user types it in the checkout."""
    return [skyrl.find_uv(), "run", "--locked", "--extra", "tinker", "--no-dev", "python", "-m", "art_rlvr.run", *words]  # fmt: skip


def tinker_env(engine: skyrl.RunningEngine, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_"))}
    return {
        **env,
        **engine.environment(),
        "UV_PROJECT_ENVIRONMENT": str(REPO / ".venv-tinker"),
        **extra,
    }


async def run(
    engine: skyrl.RunningEngine, words: list[str], **extra: str
) -> subprocess.CompletedProcess[str]:
    """The run in its own process, waited for on a thread (the test's loop stays free)."""
    return await asyncio.to_thread(
        subprocess.run, tinker_command(words), cwd=REPO, env=tinker_env(engine, **extra),
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip


def events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row.get("event") == kind]


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


async def test_rl_steps_train_on_scored_rollouts_and_resume(engine, tmp_path: Path) -> None:
    run_dir = tmp_path / "rl"
    first = await run(engine, [*SMALL, "n_batches=1", f"run_dir={run_dir}"])
    assert first.returncode == 0, first.stderr[-3000:]
    assert "backend=tinker: service http://127.0.0.1" in first.stderr
    (step,) = events(run_dir, "train")
    assert step["step"] == 1 and step["train/data/step_num_trajectories"] == 8
    assert step["train/data/step_trainable_assistant_tokens"] > 0
    rows = read_trajectories(run_dir / "trajectories" / "train_0001.jsonl")
    assert len(rows) == 8 and {row.reward for row in rows} <= {0.0, 1.0}
    assert all(row.metadata["split"] == "train" for row in rows)
    assert summary(run_dir)["steps"] == 1 and summary(run_dir)["training_tokens"] > 0

    again = await run(engine, [*SMALL, "n_batches=2", f"run_dir={run_dir}"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming at step 1 of 2" in again.stderr
    assert [e["step"] for e in events(run_dir, "train")] == [1, 2]
    assert summary(run_dir)["steps"] == 2


async def test_eval_gepa_and_expert_iteration_run_through_it(engine, tmp_path: Path) -> None:
    evaluated = await run(engine, [*SMALL, "mode=eval", f"run_dir={tmp_path / 'eval'}"])
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert summary(tmp_path / "eval")["val_accuracy_after"] is not None

    distilled = await run(engine, [*SMALL, "mode=ei", "rounds=1", "scenarios_per_round=4", f"run_dir={tmp_path / 'ei'}"])  # fmt: skip
    assert distilled.returncode == 0, distilled.stderr[-3000:]
    ei = summary(tmp_path / "ei")
    assert ei["steps"] == 1 and ei["examples_distilled"] > 0  # a supervised step on Tinker

    with ScriptedServer([], default=Step.reply(f"Better:\n```\n{BETTER}\n```")) as server:
        words = [
            *SMALL, "mode=gepa", f"run_dir={tmp_path / 'gepa'}", "reflection.model=openai/scripted",
            f"reflection.api_base={server.base_url}", "reflection.api_key_env=REFLECT_KEY",
            "max_metric_calls=12", "max_iterations=1", "pareto_size=4", "traces_per_iteration=2",
            "gepa.group_size=1", "min_improvement_threshold=-1", "report_val_limit=0", "max_tokens=12",
        ]  # fmt: skip
        evolved = await run(engine, words, REFLECT_KEY="k")
        asked = len(server.chat_requests)
    assert evolved.returncode == 0, evolved.stderr[-3000:]
    assert asked >= 1 and summary(tmp_path / "gepa")["reflection_calls"] >= 1


async def test_an_engine_serving_another_model_is_one_line(engine, tmp_path: Path) -> None:
    done = await run(engine, [*SMALL, "base_model=HuggingFaceTB/SmolLM2-360M-Instruct", f"run_dir={tmp_path / 'x'}"])  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: backend=tinker: the Tinker service at {engine.base_url} serves "
        "embedded:SmolLM2-135M-Instruct, not base_model=HuggingFaceTB/SmolLM2-360M-Instruct; "
        "restart it for this model (python -m art_rlvr.backend.external.skyrl --base-model "
        f"HuggingFaceTB/SmolLM2-360M-Instruct --port {engine.base_url.rsplit(':', 1)[1]}), or "
        "run with base_model=embedded:SmolLM2-135M-Instruct"
    )
    assert not (tmp_path / "x").exists()


async def test_a_run_whose_engine_dies_stops_with_one_line_and_resumes(
    engine, state: Path, tmp_path: Path
) -> None:
    """Last in the file: it stops the module's engine, then starts another on its state."""
    run_dir = tmp_path / "dies"
    words = [*SMALL, "n_batches=2", f"run_dir={run_dir}"]
    process = subprocess.Popen(
        tinker_command(words), cwd=REPO, env=tinker_env(engine),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 1200
    while not (run_dir / "metrics.jsonl").exists() or not events(run_dir, "train"):
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()[-3000:]  # type: ignore[union-attr]
        await asyncio.sleep(2)
    await engine.stop()
    stopped = time.monotonic()
    _, err = await asyncio.to_thread(process.communicate, timeout=300)
    assert process.returncode == 2, err[-3000:]
    assert time.monotonic() - stopped < 150
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(
            f"error: backend=tinker: the Tinker service at {engine.base_url} stopped answering"
        )
    )
    assert "re-run the same command to resume" in err and not (run_dir / "summary.json").exists()

    port = int(engine.base_url.rsplit(":", 1)[1])
    async with skyrl.running(skyrl.SkyRLSettings(port=port, state_dir=state)) as restarted:
        resumed = await run(restarted, words)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at step 1 of 2" in resumed.stderr
    assert [e["step"] for e in events(run_dir, "train")] == [1, 2]
