"""docs/scenarios.md's worked example of writing your own environment with a tool runs as
written: its Python module, TOML file and JSONL records are taken from the page, loaded through
`module:function`, and played against the scripted OpenAI-compatible server on loopback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import art
import pytest

from art_rlvr.rollouts.rollout import rollout
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.scenarios.scenario import Scenario, load_scenario
from art_rlvr.testing import ScriptedServer, Step, scripted_model

DOC = Path(__file__).resolve().parents[2] / "docs" / "scenarios.md"
SECTION = "### Writing your own environment, with a tool"


def example_blocks() -> dict[str, str]:
    """The section's fenced blocks by language (python, toml, jsonl)."""
    section = DOC.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S))


@pytest.fixture
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    blocks = example_blocks()
    assert set(blocks) == {"python", "toml", "jsonl"}
    (tmp_path / "my_env.py").write_text(blocks["python"])
    (tmp_path / "population_gap.toml").write_text(blocks["toml"])
    (tmp_path / "population_gap.jsonl").write_text(blocks["jsonl"])
    monkeypatch.syspath_prepend(str(tmp_path))  # "anywhere on the Python path"
    return load_scenario(str(tmp_path / "population_gap.toml"))


async def play(scenario: Scenario, script: list[Step]) -> tuple[art.Trajectory, ScriptedServer]:
    example = scenario.splits["val"][0]
    with ScriptedServer(script) as server:
        t = await rollout(scripted_model(server), example, sampling=SamplingConfig(temperature=0))
    return t, server


def lookups(scenario: Scenario) -> list[tuple[str, dict[str, str]]]:
    x = scenario.splits["val"][0].x
    return [("population", {"city": x["a"]}), ("population", {"city": x["b"]})]


async def test_two_lookups_and_the_answer(scenario: Scenario) -> None:
    x = scenario.splits["val"][0].x
    t, server = await play(scenario, [Step.calls(*lookups(scenario)), Step.reply(str(x["answer"]))])
    assert t.reward == 1.0 and t.metrics["correct"] == 1.0
    assert t.metrics["turns"] == 2 and t.metrics["tool_calls"] == 2
    assert t.metrics["tool_errors"] == 0
    first, second = server.chat_requests
    (schema,) = first.body["tools"]
    assert schema["function"]["description"] == "Look up how many people live in a city."
    assert schema["function"]["parameters"]["properties"]["city"]["description"]
    assert first.body["tool_choice"] == {"type": "function", "function": {"name": "population"}}
    assert "tool_choice" not in second.body  # reset after the first call
    results = [m["content"] for m in second.messages if m["role"] == "tool"]
    assert int(results[0]) - int(results[1]) == x["answer"]


async def test_a_wrong_answer_gets_one_retry_and_an_unknown_city_an_error(
    scenario: Scenario,
) -> None:
    x = scenario.splits["val"][0].x
    script = [
        Step.calls(("population", {"city": "Atlantis"})),
        Step.reply("12"),
        Step.calls(*lookups(scenario)),
        Step.reply(f"{x['answer']:,}"),
    ]
    t, _ = await play(scenario, script)
    messages = [m if isinstance(m, dict) else {"role": "assistant"} for m in t.messages_and_choices]
    tool_texts = [m["content"] for m in messages if m["role"] == "tool"]
    assert "unknown city 'Atlantis'" in tool_texts[0]
    nudges = [m["content"] for m in messages[2:] if m["role"] == "user"]
    assert nudges == ["That is not the difference. Look both cities up, then subtract."]
    assert t.reward == 1.0 and t.metrics["turns"] == 4
    assert t.metrics["tool_calls"] == 3 and t.metrics["tool_errors"] == 1
    assert json.dumps(t.logs).count("answered") == 1


async def test_wrong_twice_scores_zero_with_feedback(scenario: Scenario) -> None:
    t, _ = await play(scenario, [Step.reply("12"), Step.reply("13")])
    assert t.reward == 0.0 and t.metrics["turns"] == 2
    assert t.metadata["feedback"].startswith("wrong: '13', expected")
    assert any("wrong twice" in line for line in t.logs)
