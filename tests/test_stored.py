"""The stored trajectory (`art_rlvr.rundir.stored`): a group written to a run's trajectories file reads
back equal to the `art.TrajectoryGroup` it was (every turn, `Choice` with token ids and logprobs,
tool call and definition, additional history, metadata, logs, the group's exceptions), and a
file of the layout before still reads."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import art
import pytest
from art.trajectories import LegacyHistory
from openai.types.chat.chat_completion import Choice

from art_rlvr.core.outcome import completion_text, turns
from art_rlvr.eval.journal import JournalRow, rebuilt
from art_rlvr.rollouts.functions import rollout_failure
from art_rlvr.rollouts.rollout import rollout
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.rundir.files import RunFiles
from art_rlvr.rundir.reader import read_run_folder
from art_rlvr.rundir.stored import TrajectoryFileError, parse_group, read_groups, stored_group
from art_rlvr.scenarios.scenario import load_scenario
from art_rlvr.testing import ScriptedServer, Step, scripted_model

Make = Callable[[Any], Awaitable[art.TrajectoryGroup]]


async def single_turn(model: art.TrainableModel) -> art.TrajectoryGroup:
    """Two samples of the embedded model on arithmetic: `Choice`s with token ids, logprobs."""
    example = load_scenario("arith").splits["val"][0]
    sampling = SamplingConfig(max_tokens=8, temperature=1.0)
    samples = [
        await rollout(model, example, sampling=sampling.model_copy(update={"seed": s}))
        for s in (1, 2)
    ]
    return art.TrajectoryGroup(samples, metadata={"scenario_id": example.id}, metrics={"k": 1})


async def tool_episode(_: art.TrainableModel) -> art.TrajectoryGroup:
    """calc through the scripted server: a tool call, the tool's result, the answer."""
    example = load_scenario("calc").splits["val"][0]
    x = example.x
    script = [
        Step.calls(("multiply", json.dumps({"a": x["a"], "b": x["b"]}))),
        Step.reply(str(x["answer"])),
    ]
    with ScriptedServer(script) as server:
        t = await rollout(scripted_model(server), example, sampling=SamplingConfig(temperature=0))
    assert t.tools and any(m.get("role") == "tool" for m in turns(t))
    return art.TrajectoryGroup([t])


async def with_histories(model: art.TrainableModel) -> art.TrajectoryGroup:
    """A trajectory with an additional history holding one of its sampled turns."""
    (t, other) = (await single_turn(model)).trajectories
    sampled = [i for i in other.messages_and_choices if isinstance(i, Choice)]
    t.additional_histories = [
        LegacyHistory(
            messages_and_choices=[{"role": "user", "content": "another context"}, *sampled],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )
    ]
    return art.TrajectoryGroup([t])


async def errored(model: art.TrainableModel) -> art.TrajectoryGroup:
    """A rollout that failed (its error in metadata, logs and metrics), nested metadata, and a
    group that recorded an exception."""
    (t, _) = (await single_turn(model)).trajectories
    t.metadata = {**t.metadata, "rollout_error": "boom", "nested": {"a": [1, 2.5, None]}}
    t.logs.append("rollout error: boom")
    t.metrics["rollout_error"] = 1
    t.initial_policy_version = 0
    return art.TrajectoryGroup([t, RuntimeError("the other sample raised")], logs=["one"])


@pytest.mark.parametrize(
    "make",
    [single_turn, tool_episode, with_histories, errored],
    ids=["single-turn", "tool-calls", "additional-histories", "error-and-metadata"],
)
async def test_a_stored_group_reads_back_equal(make: Make, model, tmp_path: Path) -> None:
    group = await make(model)
    files = RunFiles(tmp_path)
    path = files.write_trajectories("train_0001", [group, group])
    (back, again) = [g.to_art() for g in read_groups(path)]
    assert back == group and again == group
    assert back.model_dump(mode="json") == group.model_dump(mode="json")
    for before, after in zip(group.trajectories, back.trajectories, strict=True):
        assert after.start_time == before.start_time
        kinds = [type(i) for i in after.messages_and_choices]
        assert kinds == [type(i) for i in before.messages_and_choices]
        for b, a in zip(before.messages_and_choices, after.messages_and_choices, strict=True):
            assert a == b
            if isinstance(a, Choice):  # what ART's tokenizer reads off a sampled turn
                assert a.model_extra == b.model_extra
                assert a.logprobs == b.logprobs
        assert after.additional_histories == before.additional_histories
        assert completion_text(after) == completion_text(before)
        assert rollout_failure(after) == rollout_failure(before)


async def test_sampled_turns_keep_the_servers_token_data(model, tmp_path: Path) -> None:
    """The embedded model's reply really carries token ids and logprobs, and so does its copy."""
    group = await single_turn(model)
    path = RunFiles(tmp_path).write_trajectories("val_0000", [group])
    (back,) = read_groups(path)
    choice = next(
        i for i in back.to_art().trajectories[0].messages_and_choices if isinstance(i, Choice)
    )
    extra = choice.model_extra or {}
    assert extra["token_ids"] and extra["prompt_token_ids"]
    assert choice.logprobs is not None and choice.logprobs.content
    assert all(c.token.startswith("token_id:") for c in choice.logprobs.content)
    view = back.trajectories[0]  # the views the report reads, without ART
    assert view.completion == completion_text(group.trajectories[0])
    assert view.scenario_id == group.trajectories[0].metadata["scenario_id"]


OLD_ROWS = [
    {  # a single-turn row as `runfiles.trajectory_row` wrote it before
        "scenario_id": "arith-val-0",
        "prompt_hash": "abc",
        "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "1+1?"}],
        "completion": "2",
        "reward": 1.0,
        "correct": True,
        "feedback": "right",
        "metrics": {"correct": 1.0, "format": 1.0},
        "logs": [],
        "sample": 1,
        "seed": 7,
    },
    {  # a multi-turn row: its last turn called a tool, so `tail` holds it and the result
        "scenario_id": "calc-val-1",
        "prompt_hash": "abc",
        "messages": [{"role": "user", "content": "3*4?"}],
        "completion": "",
        "reward": 0.0,
        "correct": False,
        "feedback": "no answer",
        "metrics": {"turns": 1.0},
        "logs": ["turn cap"],
        "tail": [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "multiply", "arguments": '{"a": 3, "b": 4}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "12"},
        ],
    },
]


def test_a_file_of_the_layout_before_still_reads(tmp_path: Path) -> None:
    """A user's old run folder: its rows read as trajectories of plain messages (their token
    data was never stored), with what the report, the export and a resumed eval need."""
    (tmp_path / "trajectories").mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"mode": "eval"}))
    path = tmp_path / "trajectories" / "val_0000.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in OLD_ROWS) + '{"scenario_id": "cu')
    run = read_run_folder(tmp_path)
    (single, multi) = run.trajectories(run.trajectory_files[0], strict=True)
    assert (single.scenario_id, single.completion, single.correct) == ("arith-val-0", "2", True)
    assert (single.meta_int("sample"), single.meta_int("seed"), single.feedback) == (1, 7, "right")
    assert [m.role for m in single.opening] == ["system", "user"] and not single.multi_turn
    assert (multi.correct, multi.metrics["correct"], multi.multi_turn) == (False, 0.0, True)
    assert [m.role for m in multi.episode] == ["user", "assistant", "tool"]
    assert multi.episode[1].tool_calls[0].name == "multiply" and multi.logs == ["turn cap"]
    restored = multi.to_art()  # an ART trajectory of plain messages, as a resumed eval books
    assert turns(restored)[-1] == OLD_ROWS[1]["tail"][-1] and restored.reward == 0.0


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ({"format": "art_rlvr.trajectory_group/9"}, "written by a newer art_rlvr"),
        ({"hello": "world"}, "no stored trajectory group and no row of the layout before"),
        ([1, 2], "not a JSON object"),
        ({"format": "art_rlvr.trajectory_group/1", "trajectories": [{"reward": "x"}]}, "reward"),
    ],
)
def test_a_line_of_no_known_layout_is_a_clear_error(line: Any, error: str, tmp_path: Path) -> None:
    path = tmp_path / "val_0000.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(TrajectoryFileError, match=error) as raised:
        read_groups(path)
    assert str(path) + ":1" in str(raised.value)
    with pytest.raises(TrajectoryFileError):
        parse_group(line)


def test_the_report_notes_a_file_it_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "trajectories").mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"mode": "rl"}))
    (tmp_path / "trajectories" / "train_0001.jsonl").write_text('{"hello": "world"}\n')
    run = read_run_folder(tmp_path)
    assert run.rollouts == [] and any("train_0001.jsonl:1" in n for n in run.notes)
    with pytest.raises(TrajectoryFileError):
        run.trajectories(run.trajectory_files[0], strict=True)


def test_stored_group_keeps_a_field_a_later_art_adds() -> None:
    group = stored_group(art.TrajectoryGroup([art.Trajectory(reward=0.5)]))
    data = json.loads(group.model_dump_json())
    data["trajectories"][0]["later_field"] = {"x": 1}
    back = parse_group(data)
    assert json.loads(back.model_dump_json())["trajectories"][0]["later_field"] == {"x": 1}


def test_an_eval_journal_of_the_layout_before_still_resumes() -> None:
    """`evals/<split>_<step>/rollouts.jsonl` rows written before held a readable `row`: a
    resumed evaluation still books them (as plain messages), with their item, sample and seed."""
    raw = {
        "item": "arith-val-0",
        "sample": 1,
        "seed": 7,
        "task": "arith",
        "session": 1,
        "session_seconds": 2.0,
        "row": OLD_ROWS[0],
    }
    row = JournalRow.model_validate(raw)
    t = rebuilt(row)
    assert row.correct and t.reward == 1.0 and t.metrics["correct"] == 1.0
    assert turns(t)[-1] == {"role": "assistant", "content": "2"}
    assert {k: t.metadata[k] for k in ("scenario_id", "sample", "seed")} == {
        "scenario_id": "arith-val-0",
        "sample": 1,
        "seed": 7,
    }
    with pytest.raises(ValueError, match="holds its rollout"):
        JournalRow.model_validate({k: v for k, v in raw.items() if k != "row"})
