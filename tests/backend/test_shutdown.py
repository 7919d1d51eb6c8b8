"""No thread of ours outlives the event loop or the backend: ART's PipelineTrainer example on
TorchBackend once ended with `terminate called without an active exception` (exit 134) after
its steps (probe of main e6a4417, finding 8). A worker that finishes after its caller's loop
closed is silent (it raised RuntimeError from `call_soon_threadsafe` in the thread before), and
`close` waits for torch work a cancelled caller left running (before, the engine's thread was
given 30 s and then left in torch while the interpreter exited)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from art_rlvr.backend.runtime.threads import OwnThreads, in_own_thread
from art_rlvr.core.callbacks import off_loop

SCRIPT = Path(__file__).parents[1] / "scripts" / "pipeline_exit.py"


def own_thread(work: Callable[[], object]) -> Awaitable[object]:
    return in_own_thread(work)


def sync_callback(work: Callable[[], object]) -> Awaitable[object]:
    return off_loop(work, label="a user's sync callable")


def finish_after_loop_closed(start: Callable[[Callable[[], object]], Awaitable[object]]) -> None:
    """Start work through `start` on a loop, cancel its caller and close the loop, then let
    the work finish (its thread then hands the result to a closed loop)."""
    started, release = threading.Event(), threading.Event()

    def work() -> int:
        started.set()
        release.wait(30)
        return 1

    loop = asyncio.new_event_loop()
    task = loop.create_task(start(work))  # type: ignore[arg-type]
    loop.run_until_complete(asyncio.wait_for(loop.run_in_executor(None, started.wait, 30), 30))
    task.cancel()
    loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()
    release.set()


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """What threads raised, uncaught (the process's hook, which would print a traceback)."""
    errors: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    return errors


@pytest.mark.parametrize("start", [own_thread, sync_callback], ids=["torch thread", "callback"])
def test_work_finishing_after_its_loop_closed_is_silent(
    start: Callable[[Callable[[], object]], Awaitable[object]], thread_errors: list[BaseException]
) -> None:
    before = set(threading.enumerate())
    finish_after_loop_closed(start)
    for thread in set(threading.enumerate()) - before:
        thread.join(10)
    assert thread_errors == []


def test_an_engine_job_finishing_after_its_loop_closed_is_silent(
    make_engine, model, thread_errors: list[BaseException]
) -> None:
    """The engine's thread hands a job's result to a caller whose loop has gone, and `close`
    waits for the job rather than leave the thread in it."""
    engine = make_engine()
    try:
        finish_after_loop_closed(lambda work: engine.run(work))
    finally:
        engine.close()
    assert not engine._thread.is_alive()
    assert thread_errors == []


async def test_close_waits_for_torch_work_a_cancelled_caller_left() -> None:
    own = OwnThreads()
    release = threading.Event()
    task = asyncio.create_task(own.run(release.wait, 30))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (own.alive, own.join(0.2)) == (1, False)
    release.set()
    assert (own.join(10), own.alive) == (True, 0)


@pytest.mark.slow
def test_pipeline_trainer_example_exits_cleanly(tmp_path: Path) -> None:
    """ART's PipelineTrainer example, two steps, in a process of its own: exit 0, no abort, no
    thread of ours left when the interpreter exits (~90 s idle, ~3 min on a loaded 2 cores)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "art"), "2"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr
    assert "step 2" in proc.stdout
    alive = next(line for line in proc.stdout.splitlines() if line.startswith("alive:"))
    assert "art-rlvr" not in alive, alive
