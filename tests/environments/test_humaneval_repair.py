"""`humaneval_repair`: scripted replies (over loopback, the scripted server) through the real
environment and the real sandbox. A failed round shows the failing test and asks for a repair;
the reward and the round metrics follow the rounds; malformed code is a failed round the model
hears about; hostile code is contained and ends with zero reward and a logged reason. No
model is loaded here."""

from __future__ import annotations

import re
import time
from pathlib import Path

import art
import pytest

from art_rlvr import load_scenario
from art_rlvr.core.outcome import feedback_of
from art_rlvr.rollouts.rollout import rollout
from art_rlvr.scenarios.sources import ScenarioFileError
from art_rlvr.testing import ScriptedServer, Step

BUILTIN = Path(__file__).resolve().parents[2] / "scenarios" / "humaneval_repair.toml"
TASK = "HumanEval/23"  # strlen(string) -> int; its tests: '' -> 0, 'x' -> 1, 'asdasnakj' -> 9
FIXED = "Here it is:\n```python\ndef strlen(string: str) -> int:\n    return len(string)\n```"
WRONG = "```python\ndef strlen(string: str) -> int:\n    return 0\n```"
FIRST_FAILURE = "wrong answer: test 2 of 3 `assert candidate('x') == 1` failed (1/3 tests passed)"


def scripted_model(server: ScriptedServer) -> art.Model:
    return art.Model(
        name="scripted", project="t", inference_base_url=server.base_url,
        inference_api_key="k", inference_model_name="scripted",
    )  # fmt: skip


def scenario_file(folder: Path, params: str, timeout_s: float = 60.0) -> Path:
    """The built-in file with other `[environment]` params."""
    text = BUILTIN.read_text()
    text = re.sub(r"(?m)^params = .*$", lambda _: f"params = {params}", text)
    text = re.sub(r"(?m)^timeout_s = .*$", f"timeout_s = {timeout_s}", text)
    path = folder / "repair.toml"
    path.write_text(text)
    return path


def strlen_task(scenario):
    return next(s for split in scenario.splits.values() for s in split if s.id == TASK)


@pytest.fixture(scope="module")
def builtin():
    return strlen_task(load_scenario("humaneval_repair", seed=0))


@pytest.fixture(scope="module")
def two_rounds(tmp_path_factory: pytest.TempPathFactory):
    """Two rounds and a one-second sandbox limit, for the cases that fail every round."""
    folder = tmp_path_factory.mktemp("repair")
    limits = "limits = { timeout_s = 1.0, memory_mb = 512, max_processes = 8 }"
    path = scenario_file(folder, f"{{ rounds = 2, code = {{ {limits} }} }}")
    return strlen_task(load_scenario(str(path), seed=0))


async def episode(sc, script: list[Step], default: Step | None = None):
    with ScriptedServer(script, default=default) as server:
        t = await rollout(scripted_model(server), sc)
        return t, server.chat_requests


async def test_a_repair_on_the_second_round(builtin) -> None:
    t, requests = await episode(builtin, [Step.reply(WRONG), Step.reply(FIXED)])
    assert len(requests) == 2 and t.reward == 1.0
    assert t.metrics["correct"] == 1 and t.metrics["first_round_correct"] == 0
    assert t.metrics["rounds"] == 2 == t.metrics["turns"]
    shown = requests[1].last_user_text
    assert shown.startswith(f"Your function failed the tests: {FIRST_FAILURE}")
    assert "(2 rounds left)" in shown and "```python" in shown
    assert t.logs == [f"turn 0: round 1: {FIRST_FAILURE}", "turn 1: round 2: all 3 tests passed"]
    assert feedback_of(t) == "passed on round 2 of 3"
    assert t.metrics["sandbox_errors"] == 0 and t.metrics["sandbox_timeouts"] == 0


async def test_a_pass_on_the_first_round_ends_the_episode(builtin) -> None:
    t, requests = await episode(builtin, [Step.reply(FIXED)])
    assert len(requests) == 1 and t.reward == 1.0
    assert t.metrics["first_round_correct"] == 1 and t.metrics["rounds"] == 1


@pytest.mark.parametrize(("wrong_rounds", "reward"), [(0, 1.0), (1, 0.5), (2, 0.25), (3, 0.0)])
async def test_the_reward_is_discounted_by_rounds(tmp_path, wrong_rounds, reward) -> None:
    sc = strlen_task(load_scenario(str(scenario_file(tmp_path, "{ rounds = 3, discount = 0.5 }"))))
    script = [Step.reply(WRONG)] * wrong_rounds + [Step.reply(FIXED)]
    t, requests = await episode(sc, script)
    assert t.reward == reward and len(requests) == min(wrong_rounds + 1, 3)
    assert t.metrics["correct"] == float(reward > 0)
    if not reward:
        assert feedback_of(t).startswith(f"not passed in 3 rounds: {FIRST_FAILURE}")
        assert t.logs[-1] == f"turn 2: round 3 (last): {FIRST_FAILURE}"
        assert t.metrics["turn_cap_hit"] == 0  # the environment ended it, not the cap


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        ("```python\ndef strlen(string:\n    return len(string)\n```", "syntax error: SyntaxError"),
        ("The length is the number of characters.", "syntax error"),
        (
            "```python\ndef strlen(string):\n    return len(",
            "syntax error",
        ),  # cut off by max_tokens
        ("", "no code in the answer"),
        (
            "```python\ndef length(string):\n    return len(string)\n```",
            "wrong answer: test 1 of 3",
        ),
        ("```python\nimport numpy_does_not_exist\n```", "ModuleNotFoundError"),
    ],
)
async def test_malformed_code_is_a_failed_round_the_model_hears_of(builtin, reply, said) -> None:
    t, requests = await episode(builtin, [Step.reply(reply), Step.reply(FIXED)])
    assert said in requests[1].last_user_text
    assert t.reward == 1.0 and t.metrics["rounds"] == 2  # nothing lost: the repair still counts


@pytest.mark.parametrize(
    ("code", "said", "timeouts", "errors"),
    [
        ("import os\nwhile True:\n    os.fork()", "BlockingIOError", 0, 0),  # fork bomb
        ("def strlen(string):\n    while True:\n        pass", "timeout", 2, 0),
        (
            "def strlen(string):\n    print('x' * 10**7)\n    return len(string)",
            "output limit",
            0,
            2,
        ),
        ("def strlen(string):\n    b = bytearray(10**10)\n    return 0", "memory limit", 0, 2),
        ("import os\nos._exit(0)", "exited before the tests finished", 0, 2),
        (
            "import os, signal\nos.kill(1, signal.SIGKILL)\ndef strlen(s):\n    return len(s)",
            "PermissionError",
            0,
            0,
        ),
        ("import socket\nsocket.create_connection(('127.0.0.1', 22), 1)", "OSError", 0, 0),
    ],
)
async def test_hostile_code_is_contained(two_rounds, code, said, timeouts, errors) -> None:
    t, requests = await episode(two_rounds, [], default=Step.reply(f"```python\n{code}\n```"))
    assert len(requests) == 2 and t.reward == 0.0 and t.metrics["correct"] == 0
    assert t.metrics["env_error"] == 0 and t.metrics["reward_error"] == 0
    assert all(said in line for line in t.logs) and len(t.logs) == 2, t.logs
    assert said in feedback_of(t)
    assert (t.metrics["sandbox_timeouts"], t.metrics["sandbox_errors"]) == (timeouts, errors)


async def test_hostile_writes_land_nowhere(two_rounds, tmp_path: Path) -> None:
    targets = [tmp_path / "pwned", Path.home() / "pwned_by_repair", BUILTIN.parent / "pwned"]
    writes = "\n".join(f"open({str(p)!r}, 'w').write('x')" for p in targets)
    t, _ = await episode(two_rounds, [], default=Step.reply(f"```python\n{writes}\n```"))
    assert t.reward == 0.0 and not any(p.exists() for p in targets)
    assert all("runtime error while defining the solution" in line for line in t.logs), t.logs


async def test_an_environment_that_outlives_its_timeout_ends_the_episode(tmp_path) -> None:
    limits = "limits = { timeout_s = 20.0 }"
    path = scenario_file(tmp_path, f"{{ rounds = 3, code = {{ {limits} }} }}", timeout_s=0.5)
    sc = strlen_task(load_scenario(str(path)))
    hang = "```python\ndef strlen(string):\n    while True:\n        pass\n```"
    started = time.monotonic()
    t, requests = await episode(sc, [], default=Step.reply(hang))
    assert time.monotonic() - started < 10  # not the sandbox's 20 s: the run was cancelled
    assert len(requests) == 1 and t.reward == 0.0 and t.metrics["env_error"] == 1
    assert "environment timed out after 0.5 s" in feedback_of(t)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("{ rounds = 0 }", "rounds"),
        ("{ discount = 0 }", "discount"),
        ("{ surprise = 1 }", "surprise"),
        ("{ code = { limits = { timeout_s = -1 } } }", "timeout_s"),
        ('{ code = { sandbox = "docker" } }', "sandbox"),
    ],
)
def test_bad_environment_params(tmp_path: Path, params: str, message: str) -> None:
    path = scenario_file(tmp_path, params)
    with pytest.raises(ScenarioFileError, match="bad parameters for environment") as caught:
        load_scenario(str(path))
    assert message in str(caught.value) and "\n" not in str(caught.value)
