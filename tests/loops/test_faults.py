"""State files under attack: corrupt, truncated, empty or another mode's state is a clear
`StateFileError` before any work is done; a line torn by a kill is dropped and the next
append starts a clean line. And a prompt longer than the context: a clear 4xx from the
server, a failed rollout that ART's `max_exceptions` absorbs, and a training step that
still happens on the groups that did complete."""

from __future__ import annotations

import json
import time
from pathlib import Path

import art
import httpx
import openai
import pytest

from art_rlvr.config.run_config import parse_args
from art_rlvr.core.outcome import feedback_of
from art_rlvr.eval.evaluate import evaluate
from art_rlvr.loops.context import RunContext
from art_rlvr.loops.rl import TrainState
from art_rlvr.loops.runner import run_phases
from art_rlvr.loops.state import ScheduleState
from art_rlvr.rollouts.rollout import gather_groups, rollout
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.rundir.events import RolloutsFailed
from art_rlvr.rundir.files import RunFiles, StateFileError, drop_torn_tail
from art_rlvr.rundir.journal import Journal
from art_rlvr.rundir.reader import read_run_folder
from art_rlvr.scenarios.scenario import Example
from art_rlvr.testing import ScriptedServer, Step

EI_STATE = '{"version": 1, "fingerprint": "0123abcd", "round": 2}'


@pytest.mark.parametrize(
    ("mode", "name", "content", "message"),
    [
        ("rl", "state.json", '{"evals": {"0": 0.', "state.json is corrupt"),
        ("rl", "state.json", "", "state.json is corrupt"),
        ("rl", "state.json", EI_STATE, "is not an RL run's state"),
        ("rl", "state.json", '{"evals": {"0": "high"}}', "is not an RL run's state (evals.0"),
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
    backend, model, scenario, tmp_path: Path, mode: str, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    cfg = parse_args([f"mode={mode}", f"run_dir={tmp_path}", "max_tokens=4", "val_limit=2"])
    ctx = RunContext(cfg, scenario, backend, model, RunFiles(tmp_path), time.monotonic())
    with pytest.raises(StateFileError, match=message.replace("(", r"\(")) as caught:
        await run_phases(ctx)
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


def long_scenario(scenario, words: int) -> Example:
    """A train scenario whose rendered prompt is far past the 2048-token context."""
    base = scenario.splits["train"][0]
    record = {**base.x, "a": f"{base.x['a']} (ignore this filler)" + " filler" * words}
    return Example(id="too-long", x=record, scenario=base.scenario, split="train")


async def test_a_prompt_past_the_context_is_a_clear_400_not_a_crash(model, scenario) -> None:
    example = long_scenario(scenario, 2000)
    with pytest.raises(openai.BadRequestError, match="context length") as caught:
        await rollout(model, example, sampling=SamplingConfig(max_tokens=4))
    assert caught.value.status_code == 400
    # the server is fine afterwards
    ok = await rollout(model, scenario.splits["train"][1], sampling=SamplingConfig(max_tokens=4))
    assert ok.metadata["scenario_id"] == scenario.splits["train"][1].id
    async with httpx.AsyncClient(base_url=model.inference_base_url) as client:
        assert (await client.get("/models", headers=auth(model))).status_code == 200


def auth(model) -> dict[str, str]:
    return {"Authorization": f"Bearer {model.inference_api_key}"}


async def test_failed_rollouts_degrade_the_step_per_max_exceptions(
    backend, make_model, scenario
) -> None:
    """One group of three fails (its prompt is too long): with max_exceptions=0 the gather
    raises; with 0.5 the step trains on the two groups that completed (their rewards are
    spread by hand so that both carry signal whatever the model sampled)."""
    model = await make_model("faults")
    examples = [long_scenario(scenario, 2000), *scenario.splits["train"][:2]]
    sampling = SamplingConfig(max_tokens=6, temperature=1.0)
    with pytest.raises(openai.BadRequestError):
        await gather_groups(model, examples, 3, sampling=sampling, seed=1, max_exceptions=0)
    groups = await gather_groups(model, examples, 3, sampling=sampling, seed=1, max_exceptions=0.5)
    assert [g.metadata["scenario_id"] for g in groups] == [s.id for s in examples[1:]]
    for group in groups:
        for i, trajectory in enumerate(group.trajectories):
            trajectory.reward = float(i % 2)
    before = await model.get_step()
    result = await backend.train(model, groups, learning_rate=1e-4)
    assert result.metrics["groups_used"] == 2 and result.step == before + 1
    assert await model.get_step() == before + 1


# ---- what the policy emits: nothing, cut off, garbage ------------------------------------


@pytest.mark.parametrize(
    ("step", "reward", "truncated", "feedback"),
    [
        (Step.empty(), 0.0, 0.0, "empty"),
        (Step.reply(None), 0.0, 0.0, "empty"),
        (Step.truncated("Let me think step by step about"), 0.0, 1.0, ""),
        (Step.reply("}}{{\x00 \ufffd ```` \\boxed{"), 0.0, 0.0, ""),
        (Step.reply("{answer}"), 1.0, 0.0, ""),  # control: the gold answer scores 1
    ],
)
async def test_policy_output_nothing_cut_off_or_garbage_scores_without_raising(
    scenario, step: Step, reward: float, truncated: float, feedback: str
) -> None:
    """A policy endpoint (scripted, on loopback) that emits nothing, hits max_tokens with
    no stop, or emits bytes no parser expects: the rollout scores it, marks it, and the
    group it belongs to still forms."""
    example = scenario.splits["train"][0]
    if step.text == "{answer}":
        step = Step.reply(str(example.x["answer"]))
    with ScriptedServer([], default=step) as server:
        policy = art.Model(
            name="scripted-policy", project="t", inference_base_url=server.base_url,
            inference_api_key="k", inference_model_name="scripted",
        )  # fmt: skip
        groups = await gather_groups(policy, [example], 2, max_exceptions=0)
    trajectories = groups[0].trajectories
    assert [t.reward for t in trajectories] == [reward, reward]
    assert {t.metrics["truncated"] for t in trajectories} == {truncated}
    assert all(feedback in feedback_of(t) for t in trajectories)


# ---- a kill after the checkpoint landed, before the step was booked ----------------------


@pytest.mark.parametrize("metrics_saved", [False, True])
async def test_a_step_trained_just_before_a_kill_is_booked_once_on_resume(
    backend, make_model, scenario, tmp_path: Path, metrics_saved: bool
) -> None:
    """The state a kill leaves in that window (the checkpoint of step 1 is on disk; the batch
    is saved as pending; no metrics line, no trajectory file): the resumed run books step 1
    from the saved batch, once, and trains nothing again. A kill right after the checkpoint
    loses the backend's metrics (and says so); once they are saved beside the pending batch,
    the booked step carries them as an unkilled run does."""
    model = await make_model(f"pending-{metrics_saved}")
    words = ["mode=rl", f"run_dir={tmp_path}", "n_batches=1", "eval_every=1", "val_limit=2",
             "groups_per_batch=2", "group_size=2", "max_tokens=4", "eval_test=false"]  # fmt: skip
    files = RunFiles(tmp_path)
    ctx = RunContext(parse_args(words), scenario, backend, model, files, time.monotonic())
    first = await run_phases(ctx)
    state = json.loads((tmp_path / "state.json").read_text())
    train = next(r for r in files.metrics() if r["event"] == "train")
    trajectories = tmp_path / "trajectories"
    # rewind the bookkeeping of step 1 to the moment before it was booked
    (trajectories / "train_0001.jsonl").replace(trajectories / "train_pending.jsonl")
    rows = [r for r in files.metrics() if r["event"] != "train"]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stats = {k: v for k, v in train.items() if k in {"reward_mean", "trajectories", "accuracy"}}
    pending = {"from_step": 0, "stats": stats}
    trained = {k.removeprefix("train/"): v for k, v in train.items() if k.startswith("train/")}
    if metrics_saved:
        pending |= {"landed_step": 1, "train_metrics": trained, "seconds": 1.0}
    state |= {"pending": pending, "rollouts": 0, "step_seconds": [], "train_rewards": {},
              "tokens_trained": 0}  # fmt: skip
    (tmp_path / "state.json").write_text(json.dumps(state))

    files = RunFiles(tmp_path)  # the restarted process reads the rewound folder afresh
    again = await run_phases(RunContext(parse_args(words), scenario, backend, model, files, 0.0))
    booked = [r for r in files.metrics() if r["event"] == "train"]
    assert [(r["step"], r.get("recovered_after_kill")) for r in booked] == [
        (1, None if metrics_saved else 1.0)
    ]
    assert ("train/loss" in booked[0]) == metrics_saved
    if metrics_saved:
        assert {k: v for k, v in booked[0].items() if k.startswith("train/")} == {
            k: v for k, v in train.items() if k.startswith("train/")
        }
    assert (trajectories / "train_0001.jsonl").exists()
    assert not (trajectories / "train_pending.jsonl").exists()
    assert await model.get_step() == 1 and again["steps"] == first["steps"] == 1
    assert again["rollouts"] == first["rollouts"] == 4
    assert json.loads((tmp_path / "state.json").read_text())["pending"] is None
    # the loss is said beyond metrics.jsonl: in summary.json and the report (finding 7 of the
    # probe of e6a4417: training_tokens 2517 instead of 3147, and nothing said so)
    assert again.get("recovered_steps") == (None if metrics_saved else [1])
    notes = [n for n in read_run_folder(tmp_path).notes if "without their training metrics" in n]
    assert len(notes) == (0 if metrics_saved else 1)


# ---- an evaluation in which every rollout errored --------------------------------------


@pytest.mark.parametrize(
    ("steps", "failed"),
    [
        ([], True),  # every request answered 400: all rollouts error
        ([Step.reply("{answer}")], False),  # one answers, the rest error: a rate, not a failure
    ],
)
async def test_an_evaluation_where_every_rollout_errored_fails_with_its_cause(
    scenario, steps: list[Step], failed: bool
) -> None:
    """An evaluation is an error with the first rollout's cause when every rollout errored,
    never accuracy 0.0; when only some errored, their rate and first cause come with the
    accuracy."""
    examples = scenario.splits["val"][:3]
    script = [
        Step.reply(str(examples[0].x["answer"])) if s.text == "{answer}" else s for s in steps
    ]
    with ScriptedServer(script, default=Step.error(400, text="no chat template")) as server:
        policy = art.Model(
            name="scripted-policy", project="t", inference_base_url=server.base_url,
            inference_api_key="k", inference_model_name="scripted",
        )  # fmt: skip
        if failed:
            with pytest.raises(RolloutsFailed, match=r"all 3 val rollouts failed.*BadRequestError"):
                await evaluate(policy, examples)
            return
        report = await evaluate(policy, examples)
    assert report.errors == 2 and report.first_error and "BadRequestError" in report.first_error
    assert "2 errored (67%" in report.line()


# ---- state files written before the state models: a resume still reads them -------------


@pytest.mark.parametrize(
    ("model", "written"),
    [
        (
            TrainState,
            {"evals": {"0": 0.4, "2": 0.5}, "pending": {"from_step": 2, "stats": {"accuracy": 0.5}},
             "tokens_trained": 310, "rollouts": 72, "step_seconds": [12.5, 11.0],
             "train_rewards": {"1": 0.3, "2": 0.4}, "alarms": [], "early_stop": None},
        ),
        (
            ScheduleState,
            {"phase": 2, "prompt": "Answer.", "evals": {"start": 0.4, "rl_r0": 0.5},
             "curve": [{"after": "start", "step": 0, "val": 0.4}], "frontier": ["Be brief."],
             "prompt_changes": [{"round": 1, "phase": 1, "step": 1, "old": "A", "new": "B",
                                 "old_pareto_mean": 0.2, "new_pareto_mean": 0.6,
                                 "origin": "reflection", "old_val_accuracy": None,
                                 "new_val_accuracy": 0.5}],
             "phase_target": None, "ei_buffer": None, "ei_totals": {"recovered": 2},
             "teacher_counters": {"calls": 3}, "gepa_metric_calls": 16, "reflection_calls": 2,
             "reflection_errors": 0, "rollouts": 12, "step_seconds": [3.0]},
        ),
    ],
)  # fmt: skip
def test_state_files_round_trip_through_their_models(
    tmp_path: Path, model: type[TrainState], written: dict
) -> None:
    """A state as the loops wrote it (dicts, before the models) resumes; what the model writes
    back reads back equal, through the same atomic writer."""
    (tmp_path / "state.json").write_text(json.dumps(written))
    files = RunFiles(tmp_path)
    state = files.read_state("state.json", model, "a test")
    assert state is not None and state.evals == written["evals"]
    files.write_state("state.json", state)
    assert files.read_state("state.json", model, "a test") == state
