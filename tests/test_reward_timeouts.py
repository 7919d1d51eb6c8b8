"""A reward that never returns, sync or async: a one-line error when the scenario loads (the
reward is tried on one record), and a score of 0 with the reason logged when it hangs later,
while the event loop keeps running. On main e6a4417 the load hung (a sync reward ran on the
calling thread, an async one in `asyncio.run`, neither under a timeout) and so did `Task.score`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest

from art_rlvr import load_scenario
from art_rlvr.scenarios.sources import ScenarioFileError

REWARDS = """
import asyncio, time

def sleeps(x, y):
    time.sleep(10**6)

async def sleeps_async(x, y):
    await asyncio.sleep(10**6)

class Sleeper:
    def __call__(self, x, y):
        time.sleep(10**6)

def sleeps_on_replies(x, y):
    if y:
        time.sleep(10**6)
    return 0.0

async def sleeps_async_on_replies(x, y):
    if y:
        await asyncio.sleep(10**6)
    return 0.0

sleeper = Sleeper()
"""
TIMEOUT_S = 0.5


def example(folder: Path, fn: str) -> Path:
    (folder / "slow_rewards.py").write_text(REWARDS)
    rows = [{"qid": f"q{i}", "question": f"{i}+1?", "answer": i + 1} for i in range(3)]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = folder / "slow.toml"
    path.write_text(
        'name = "slow"\nuser_template = "Q: {question}"\nid_field = "qid"\n'
        '[source]\ntype = "jsonl"\npath = "data.jsonl"\nrequired_fields = ["question"]\n'
        "splits = { train = 2, val = 1, test = 0 }\n"
        f'[reward]\nname = "slow_rewards:{fn}"\ntimeout_s = {TIMEOUT_S}\n'
    )
    return path


@pytest.mark.parametrize("fn", ["sleeps", "sleeps_async", "sleeper"])
def test_a_reward_that_never_returns_is_a_one_line_error_at_load(tmp_path: Path, fn: str) -> None:
    started = time.monotonic()
    with pytest.raises(ScenarioFileError) as error:
        load_scenario(str(example(tmp_path, fn)))
    message = str(error.value)
    assert time.monotonic() - started < TIMEOUT_S + 5
    assert f"reward 'slow_rewards:{fn}' did not return within {TIMEOUT_S:g} s" in message, message
    assert message.startswith(f"{tmp_path / 'slow.toml'}:") and "\n" not in message


@pytest.mark.parametrize("fn", ["sleeps_on_replies", "sleeps_async_on_replies"])
async def test_a_reward_that_hangs_in_a_run_scores_zero_and_says_why(
    tmp_path: Path, fn: str, caplog: pytest.LogCaptureFixture
) -> None:
    scenario = load_scenario(str(example(tmp_path, fn)))
    record = scenario.splits["train"][0]
    lag = 0.0

    async def tick() -> None:  # the loop must keep running while the reward hangs
        nonlocal lag
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.01)
            lag = max(lag, time.monotonic() - before - 0.01)

    ticker = asyncio.ensure_future(tick())
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="art_rlvr.scenarios.scenario"):
        score = await record.score("42")
    ticker.cancel()
    assert time.monotonic() - started < TIMEOUT_S + 5
    assert score.reward == 0.0 and score.correct is False
    assert f"did not return within {TIMEOUT_S:g} s" in score.feedback
    assert any("scored 0" in r.getMessage() and record.id in r.getMessage() for r in caplog.records)
    assert lag < 0.25


async def test_a_sync_reward_runs_off_the_loop(tmp_path: Path) -> None:
    """Several hanging sync rewards at once: each in a thread of its own, none waits for
    another (a shared pool of workers would be exhausted by them)."""
    scenario = load_scenario(str(example(tmp_path, "sleeps_on_replies")))
    started = time.monotonic()
    scores = await asyncio.gather(*(scenario.splits["train"][0].score(str(i)) for i in range(40)))
    assert time.monotonic() - started < TIMEOUT_S + 5
    assert {s.reward for s in scores} == {0.0}
