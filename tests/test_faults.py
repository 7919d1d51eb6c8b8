"""State files under attack: corrupt, truncated, empty or another mode's state is a clear
`StateFileError` before any work is done; a line torn by a kill is dropped and the next
append starts a clean line. And a prompt longer than the context: a clear 4xx from the
server, a failed rollout that ART's `max_exceptions` absorbs, and a training step that
still happens on the groups that did complete."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from art_rlvr.config import parse_args
from art_rlvr.gepa.adapter import Journal
from art_rlvr.loops.files import RunFiles, StateFileError, drop_torn_tail
from art_rlvr.loops.rl import RunContext
from art_rlvr.rollouts import SamplingConfig, gather_groups, rollout
from art_rlvr.run import run_mode
from art_rlvr.scenario import Scenario

EI_STATE = '{"version": 1, "fingerprint": "0123abcd", "round": 2}'


@pytest.mark.parametrize(
    ("mode", "name", "content", "message"),
    [
        ("rl", "state.json", '{"evals": {"0": 0.', "state.json is corrupt"),
        ("rl", "state.json", "", "state.json is corrupt"),
        ("rl", "state.json", EI_STATE, "is not an RL run's state"),
        ("gepa", "gepa/state.json", '{"version": 1, "fingerpr', "state.json is corrupt"),
        ("gepa", "gepa/state.json", '{"evals": {}}', "is not a GEPA state"),
        ("gepa", "gepa/journal.jsonl", '{"a": 1}\nnot json\n{"b": 2}\n', "journal.jsonl:2 is"),
        ("ei", "state.json", '{"fingerprint": "ab', "state.json is corrupt"),
        ("ei", "state.json", '{"evals": {}}', "is not an expert-iteration state"),
        ("gepa_rl", "state.json", "[1, 2]", "is not a schedule's state"),
        ("gepa_rl", "state.json", '{"phase": 1}', "is not a schedule's state"),
    ],
)
async def test_bad_state_files_are_clear_errors_before_any_work(
    backend, model, task, tmp_path: Path, mode: str, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    cfg = parse_args([f"mode={mode}", f"run_dir={tmp_path}", "max_tokens=4", "val_limit=2"])
    ctx = RunContext(cfg, task, backend, model, RunFiles(tmp_path), time.monotonic())
    with pytest.raises(StateFileError, match=message.replace("(", r"\(")) as caught:
        await run_mode(ctx)
    assert str(tmp_path) in str(caught.value)
    assert path.read_text() == content  # left as found, for the user to inspect
    assert not (tmp_path / "trajectories").exists()  # nothing was evaluated or trained


@pytest.mark.parametrize(
    ("content", "kept", "cut"),
    [
        ('{"a": 1}\n{"b": 2}\n', [{"a": 1}, {"b": 2}], False),
        ('{"a": 1}\n{"b": 2', [{"a": 1}], True),  # torn mid-record
        ('{"a": 1}\n{"b": 2}', [{"a": 1}], True),  # complete but never acknowledged (no \n)
        ('{"a"', [], True),
        ("", [], False),
    ],
)
def test_a_torn_journal_tail_is_dropped_and_the_next_append_is_clean(
    tmp_path: Path, content: str, kept: list[dict], cut: bool
) -> None:
    cut_here = tmp_path / "cut.jsonl"
    cut_here.write_text(content)
    assert drop_torn_tail(cut_here) is cut
    assert cut_here.read_text() == "".join(f"{json.dumps(r)}\n" for r in kept)
    path = tmp_path / "journal.jsonl"  # the journal repairs its own file on load
    path.write_text(content)
    journal = Journal(path)
    assert journal.load() == kept
    journal.append({"c": 3})
    assert Journal(path).load() == [*kept, {"c": 3}]


def test_metrics_after_a_torn_line_stay_readable(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"event": "train", "step": 1}\n{"event": "tr')
    files = RunFiles(tmp_path)
    files.append_metrics({"event": "train", "step": 2})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]


# ---- a prompt longer than the context ------------------------------------------------------


def long_scenario(task, words: int) -> Scenario:
    """A train scenario whose rendered prompt is far past the 2048-token context."""
    base = task.splits["train"][0]
    record = {**base.x, "a": f"{base.x['a']} (ignore this filler)" + " filler" * words}
    return Scenario(id="too-long", x=record, task=base.task, split="train")


async def test_a_prompt_past_the_context_is_a_clear_400_not_a_crash(model, task) -> None:
    scenario = long_scenario(task, 2000)
    with pytest.raises(openai.BadRequestError, match="context length") as caught:
        await rollout(model, scenario, sampling=SamplingConfig(max_tokens=4))
    assert caught.value.status_code == 400
    # the server is fine afterwards
    ok = await rollout(model, task.splits["train"][1], sampling=SamplingConfig(max_tokens=4))
    assert ok.metadata["scenario_id"] == task.splits["train"][1].id
    async with httpx.AsyncClient(base_url=model.inference_base_url) as client:
        assert (await client.get("/models", headers=auth(model))).status_code == 200


def auth(model) -> dict[str, str]:
    return {"Authorization": f"Bearer {model.inference_api_key}"}


async def test_failed_rollouts_degrade_the_step_per_max_exceptions(
    backend, make_model, task
) -> None:
    """One group of three fails (its prompt is too long): with max_exceptions=0 the gather
    raises; with 0.5 the step trains on the two groups that completed (their rewards are
    spread by hand so that both carry signal whatever the model sampled)."""
    model = await make_model("faults")
    scenarios = [long_scenario(task, 2000), *task.splits["train"][:2]]
    sampling = SamplingConfig(max_tokens=6, temperature=1.0)
    with pytest.raises(openai.BadRequestError):
        await gather_groups(model, scenarios, 3, sampling=sampling, seed=1, max_exceptions=0)
    groups = await gather_groups(model, scenarios, 3, sampling=sampling, seed=1, max_exceptions=0.5)
    assert [g.metadata["scenario_id"] for g in groups] == [s.id for s in scenarios[1:]]
    for group in groups:
        for i, trajectory in enumerate(group.trajectories):
            trajectory.reward = float(i % 2)
    before = await model.get_step()
    result = await backend.train(model, groups, learning_rate=1e-4)
    assert result.metrics["groups_used"] == 2 and result.step == before + 1
    assert await model.get_step() == before + 1
