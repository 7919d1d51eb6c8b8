"""`observe.tracing`: Weave spans of multi-turn scenarios (issue 21, "Seeing it"): a rollout of `calc` (a tool
call that works, one that fails, then the answer) and of `arith_retry` (a wrong answer, the
environment's feedback, the right one) traced to a recording trace server on loopback. Each
episode is one `art_rlvr.episode` span under its `art_rlvr.rollout`, with one `art_rlvr.turn`
span per sampled turn, one `art_rlvr.tool` span per tool call and one `art_rlvr.env` span per
environment answer under it, each with the inputs and outputs a reader needs."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from test_observe import weave_env  # weave pointed at loopback only

from art_rlvr.testing.trace_server import RecordingTraceServer

# A child process: weave.init is process-wide, and the suite's other tests must stay untraced.
ROLLOUTS_UNDER_WEAVE = """
import asyncio, json
import art
from art_rlvr.observe.tracing import finish_weave, setup_weave
from art_rlvr.rollouts.rollout import rollout
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.scenarios.scenario import load_scenario
from art_rlvr.testing import ScriptedServer, Step

def model(server):
    return art.Model(name="traced", project="t", inference_base_url=server.base_url,
                     inference_api_key="k", inference_model_name="scripted")

async def episode(name, script):
    scenario = load_scenario(name).splits["val"][0]
    with ScriptedServer(script(scenario.x)) as server:
        t = await rollout(model(server), scenario, sampling=SamplingConfig(temperature=0))
    return {"scenario_id": scenario.id, "x": scenario.x, "reward": t.reward,
            "metrics": t.metrics}

async def main():
    assert setup_weave("tester/episodes")
    out = {
        "calc": await episode("calc", lambda x: [
            Step.calls(("multiply", {"a": x["a"], "b": x["b"]}),
                       ("multiply", {"a": "2 +* 3", "b": 1})),
            Step.reply(str(x["answer"])),
        ]),
        "arith_retry": await episode("arith_retry", lambda x: [
            Step.reply(str(x["answer"] + 1)), Step.reply(str(x["answer"])),
        ]),
    }
    finish_weave()
    print("RESULT " + json.dumps(out))

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def traced() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(every recorded call, what each rollout returned), from one child process."""
    with RecordingTraceServer() as trace:
        command = [sys.executable, "-c", ROLLOUTS_UNDER_WEAVE]
        env = weave_env(trace)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        calls = trace.calls()
    (line,) = [s for s in done.stdout.splitlines() if s.startswith("RESULT ")]
    return calls, json.loads(line.removeprefix("RESULT "))


def tree(calls: list[dict[str, Any]], scenario_id: str) -> dict[str, list[dict[str, Any]]]:
    """The calls under the rollout of `scenario_id`, by op name (the rollout itself included)."""
    children: dict[str | None, list[dict[str, Any]]] = {}
    for call in calls:
        children.setdefault(call.get("parent_id"), []).append(call)
    (root,) = [
        c
        for c in calls
        if c["name"] == "art_rlvr.rollout" and c["inputs"]["scenario_id"] == scenario_id
    ]
    found, todo = [root], [root]
    while todo:
        kids = children.get(todo.pop()["id"], [])
        found += kids
        todo += kids
    by_name: dict[str, list[dict[str, Any]]] = {}
    for call in found:
        by_name.setdefault(call["name"], []).append(call)
    return by_name


def parent_names(calls: list[dict[str, Any]], of: list[dict[str, Any]]) -> set[str]:
    names = {c["id"]: c["name"] for c in calls}
    return {names[c["parent_id"]] for c in of}


def test_calc_episode_has_a_span_per_turn_and_per_tool_call(traced) -> None:
    calls, result = traced
    calc = result["calc"]
    spans = tree(calls, calc["scenario_id"])
    (episode,) = spans["art_rlvr.episode"]
    turns, tools = spans["art_rlvr.turn"], spans["art_rlvr.tool"]
    assert parent_names(calls, spans["art_rlvr.episode"]) == {"art_rlvr.rollout"}
    assert parent_names(calls, turns + tools) == {"art_rlvr.episode"}
    assert len(turns) == calc["metrics"]["turns"] == 2
    assert len(tools) == calc["metrics"]["tool_calls"] == 2
    # turn 0 asked with the opening and the tools, and its output is the tool-calling message
    first, second = sorted(turns, key=lambda c: c["inputs"]["index"])
    assert [m["role"] for m in first["inputs"]["messages"]] == ["system", "user"]
    called = [c["function"]["name"] for c in first["output"]["tool_calls"]]
    assert called == ["multiply", "multiply"]
    # turn 1 saw both tool results, and its output is the answer
    seen = [m for m in second["inputs"]["messages"] if m["role"] == "tool"]
    x = calc["x"]
    assert [m["content"] for m in seen][:1] == [str(x["a"] * x["b"])]
    assert "do not match its schema" in seen[1]["content"]
    assert second["output"]["content"] == str(x["answer"])
    # each tool span: the name and arguments the model sent, what came back
    by_args = {c["inputs"]["arguments"]: c for c in tools}
    good = by_args[json.dumps({"a": x["a"], "b": x["b"]})]
    bad = by_args[json.dumps({"a": "2 +* 3", "b": 1})]
    assert good["inputs"]["name"] == "multiply" and good["output"]["status"] == "ok"
    assert good["output"]["content"] == str(x["answer"])
    assert bad["output"]["status"] != "ok" and "do not match its schema" in bad["output"]["error"]
    assert episode["output"]["metrics"]["tool_errors"] == calc["metrics"]["tool_errors"] == 1
    assert "art_rlvr.env" not in spans  # calc has no environment turns, only tools
    (rollout,) = spans["art_rlvr.rollout"]
    assert rollout["output"]["reward"] == calc["reward"] == 1.0


def test_arith_retry_episode_shows_the_environment_feedback(traced) -> None:
    calls, result = traced
    retry = result["arith_retry"]
    spans = tree(calls, retry["scenario_id"])
    turns, envs = spans["art_rlvr.turn"], spans["art_rlvr.env"]
    assert parent_names(calls, turns + envs) == {"art_rlvr.episode"}
    assert len(turns) == len(envs) == retry["metrics"]["turns"] == 2
    wrong, right = sorted(envs, key=lambda c: c["inputs"]["index"])
    answer = retry["x"]["answer"]
    assert wrong["inputs"]["reply"] == str(answer + 1) and not wrong["output"]["done"]
    (feedback,) = wrong["output"]["messages"]
    assert feedback["role"] == "user" and "Try again" in feedback["content"]
    assert right["inputs"]["reply"] == str(answer) and right["output"]["done"]
    assert "solved on try 2" in right["output"]["log"]
    # the second turn was sampled with the feedback in its history
    second = max(turns, key=lambda c: c["inputs"]["index"])
    assert second["inputs"]["messages"][-1] == feedback
    assert retry["reward"] == 0.5  # discount 0.5 for the second try
