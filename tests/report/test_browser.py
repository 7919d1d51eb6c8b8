"""The report's trajectory browser and episode curves on multi-turn runs: the browser shows whole
episodes (every turn, tool calls with their arguments, tool results, the environment's
messages, the logs) and the curves of turns, tool calls, tool errors and illegal actions per
episode, plus a mixture's accuracy per scenario.

Two run folders: a real tiny RL run of `calc` with a named `tool_choice` on the embedded model
(opened in headless Chromium), and one written by the loops' own writers from real rollouts of
`calc`, `arith_retry` and `tictactoe` against the scripted OpenAI-compatible server on loopback
(the cases a small model rarely produces on cue: a turn cap hit mid-call, hostile arguments,
illegal moves)."""

from __future__ import annotations

import base64
import json
import statistics
import subprocess
import sys
from html import escape
from pathlib import Path
from typing import Any

import art
import pytest
from test_report import PNG_MAGIC, Dom, browse, dump_dom  # the page's parser, Chromium

from art_rlvr.loops.context import group_metrics
from art_rlvr.report.__main__ import main
from art_rlvr.rollouts.rollout import rollout
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.rundir.events import EvalEvent, TrainEvent
from art_rlvr.rundir.files import RunFiles
from art_rlvr.rundir.stored import StoredTrajectory, read_groups
from art_rlvr.scenarios.scenario import Example, load_scenario
from art_rlvr.testing import ScriptedServer, Step, scripted_model

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
HOSTILE = "<script>alert(1)</script>"


def rows(path: Path) -> list[StoredTrajectory]:
    return [t for g in read_groups(path) for t in g.trajectories]


def calls_of(row: StoredTrajectory) -> list[tuple[str, str]]:
    """(name, arguments) of every tool call in a stored trajectory, in order."""
    return [(c.name, c.arguments) for m in row.episode for c in m.tool_calls]


def shown_call(name: str, arguments: str) -> str:
    """How the page writes a tool call (escaped, as every text from a run is)."""
    return f"&#8594; {escape(name)}({escape(arguments)})"


# ------------------------------------------------------------------ a real run on the model


RUN = [
    "mode=rl",
    "n_batches=1",
    "groups_per_batch=2",
    "group_size=2",
    "eval_every=1",
    "val_limit=2",
    "eval_test=false",
    "max_tokens=48",
]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`calc` with `tool_choice` naming its tool: turn 0 is a schema-valid call
    (constrained decoding), so the episodes have tool calls and results to show."""
    root = tmp_path_factory.mktemp("episodes")
    toml = (SCENARIOS / "calc.toml").read_text()
    toml = toml.replace('tool_choice = "auto"', 'tool_choice = "multiply"').replace(
        "train = 400, val = 50, test = 50", "train = 8, val = 2, test = 2"
    )
    assert 'tool_choice = "multiply"' in toml and "val = 2" in toml
    (root / "calc_named.toml").write_text(toml)
    run_dir = root / "run"
    scenario = f"scenario={root / 'calc_named.toml'}"
    proc = subprocess.run(
        [sys.executable, "-m", "art_rlvr.run", scenario, *RUN, f"run_dir={run_dir}"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert main([str(run_dir)]) == 0
    return run_dir


@pytest.mark.slow  # a real calc RL run in a subprocess; `uv run pytest -m slow`
def test_real_calc_run_records_and_shows_its_episodes(real_run: Path) -> None:
    events = [json.loads(line) for line in (real_run / "metrics.jsonl").read_text().splitlines()]
    (train,) = [TrainEvent.model_validate(e) for e in events if e["event"] == "train"]
    batch = rows(real_run / "trajectories" / "train_0001.jsonl")
    assert train.model_extra["tool_calls_per_episode"] == pytest.approx(
        statistics.fmean(r.metrics["tool_calls"] for r in batch)
    )
    assert train.model_extra["turns_per_episode"] >= 1
    html = (real_run / "report" / "index.html").read_text()
    png = (real_run / "report" / "episodes.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and base64.b64encode(png).decode() in html
    # every tool call of an evaluation's episodes is on the page, with its arguments
    val = rows(real_run / "trajectories" / "val_0001.jsonl")
    calls = [c for r in val for c in calls_of(r)]
    assert calls, "the named tool_choice forced no call"  # turn 0 of every episode is a call
    failures = [r for r in val if not r.correct]
    for row in failures:
        for name, arguments in calls_of(row):
            assert shown_call(name, arguments) in html
        for m in row.episode:
            if m.role == "tool":
                assert escape(m.content) in html
    assert "tool result: multiply" in html and "assistant, turn 1" in html


@pytest.mark.slow
@pytest.mark.browser
def test_real_calc_report_in_chromium(real_run: Path, tmp_path: Path) -> None:
    dom = Dom(dump_dom(real_run / "report" / "index.html", tmp_path))
    assert "plot-episodes" in dom.images
    head, _, data = dom.images["plot-episodes"].partition(",")
    assert head == "data:image/png;base64"
    assert base64.b64decode(data, validate=True).startswith(PNG_MAGIC)
    text = "".join(dom.trajectory_text)
    val = rows(real_run / "trajectories" / "val_0001.jsonl")
    for row in val:
        if not row.correct:
            assert all(f"{n}({a})" in text for n, a in calls_of(row))


# ------------------------------------------------------------------ scripted episodes


async def episode(scenario: Example, script: list[Step]) -> art.Trajectory:
    with ScriptedServer(script) as server:
        return await rollout(
            scripted_model(server), scenario, sampling=SamplingConfig(temperature=0)
        )


def product(x: dict[str, Any]) -> str:
    return json.dumps({"a": x["a"], "b": x["b"]})


async def scripted_groups() -> dict[str, list[art.TrajectoryGroup]]:
    """Real rollouts of three environments, scripted turn by turn."""
    calc = load_scenario("calc").splits["val"][:2]
    retry = load_scenario("arith_retry").splits["val"][0]
    game = load_scenario("tictactoe").splits["val"][0]
    x0, x1 = calc[0].x, calc[1].x
    solved = await episode(
        calc[0], [Step.calls(("multiply", product(x0))), Step.reply(str(x0["answer"]))]
    )
    capped = await episode(  # calls the tool on every turn: the cap ends it mid-call
        calc[1],
        [Step.calls(("multiply", json.dumps({"a": HOSTILE, "b": 1})))]
        + [Step.calls(("multiply", product(x1)))] * 3,
    )
    retried = await episode(
        retry, [Step.reply(str(retry.x["answer"] + 1)), Step.reply(str(retry.x["answer"]))]
    )
    forfeit = await episode(game, [Step.reply("I pass"), Step.reply("ten"), Step.reply("0")])
    return {
        "calc": [art.TrajectoryGroup([solved, capped])],
        "other": [art.TrajectoryGroup([retried]), art.TrajectoryGroup([forfeit])],
    }


@pytest.fixture(scope="module")
async def scripted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder written by the loops' writers: train steps 1 and 2 (their metrics from
    `group_metrics`), two evaluations with per-scenario accuracy, trajectories of each."""
    root = tmp_path_factory.mktemp("scripted") / "run"
    files = RunFiles(root)
    files.write_json("config.json", {"mode": "rl", "scenario": "calc", "seed": 0})
    groups = await scripted_groups()
    for step, batch in ((1, groups["calc"]), (2, groups["other"])):
        files.append_event(TrainEvent(step=step, **group_metrics(batch)))
        files.write_trajectories(f"train_{step:04d}", batch)
    for step, accuracy in ((0, {"calc": 0.2, "arith_retry": 0.5}), (2, {"calc": 0.4})):
        event = EvalEvent(
            split="val", step=step, accuracy=0.3, reward_mean=0.3, by_scenario=accuracy
        )
        files.append_event(event)
        files.write_trajectories(f"val_{step:04d}", groups["calc"] + groups["other"])
    assert main([str(root)]) == 0
    return root


async def test_group_metrics_carry_the_episode_means(scripted_run: Path) -> None:
    events = [
        json.loads(line) for line in (scripted_run / "metrics.jsonl").read_text().splitlines()
    ]
    first, second = [e for e in events if e["event"] == "train"]
    assert first["turns_per_episode"] == 3.0  # 2 turns solved, 4 (the cap) capped
    assert first["tool_calls_per_episode"] == 2.5 and first["tool_errors_per_episode"] == 0.5
    assert first["turn_cap_hit_per_episode"] == 0.5
    assert "illegal_actions_per_episode" not in first  # no environment counts them in calc
    assert second["illegal_actions_per_episode"] == 3.0  # the game's three; retry reports none
    # a single-turn batch adds nothing: its records stay as they were
    arith = load_scenario("arith").splits["val"][0]
    one = await episode(arith, [Step.reply(str(arith.x["answer"]))])
    single = group_metrics([art.TrajectoryGroup([one])])
    assert not [k for k in single if k.endswith("_per_episode")]


def test_browser_shows_whole_episodes(scripted_run: Path) -> None:
    html = (scripted_run / "report" / "index.html").read_text()
    calc_rows = rows(scripted_run / "trajectories" / "train_0001.jsonl")
    capped = next(r for r in calc_rows if r.metrics["turn_cap_hit"])
    # the capped episode ends in its last turn's call and the tool's result, both shown
    last_turn = [m for m in capped.episode if m.sampled][-1]
    assert last_turn.tool_calls and capped.episode[-1].role == "tool"
    for name, arguments in calls_of(capped):
        assert shown_call(name, arguments) in html
    assert escape(json.dumps({"a": HOSTILE, "b": 1})) in html and HOSTILE not in html
    assert escape(capped.episode[-1].content) in html
    assert "4 turns, 4 tool calls, 1 tool error" in html
    assert "turn cap: the episode wanted more than 4 turns" in html
    # arith_retry: the environment's feedback between the two replies
    retry = next(
        r
        for r in rows(scripted_run / "trajectories" / "train_0002.jsonl")
        if "arith" in r.scenario_id
    )
    feedback = next(
        m.content for m in retry.episode if m.role == "user" and "Try again" in m.content
    )
    assert f'<span class="role">environment</span><pre class="env">{escape(feedback)}' in html
    assert "3 illegal actions" in html


def test_episode_and_scenario_curves(scripted_run: Path) -> None:
    html = (scripted_run / "report" / "index.html").read_text()
    for name in ("episodes", "scenarios"):
        png = (scripted_run / "report" / f"{name}.png").read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 5000
        assert f'id="plot-{name}"' in html


def test_single_turn_runs_draw_no_episode_curves(tmp_path: Path) -> None:
    """The new figures need their data: an ordinary run's report is as it was."""
    files = RunFiles(tmp_path / "run")
    files.write_json("config.json", {"mode": "rl", "scenario": "arith", "seed": 0})
    files.append_event(TrainEvent(step=1, reward_mean=0.5, accuracy=0.5))
    files.append_event(EvalEvent(split="val", step=0, accuracy=0.5, reward_mean=0.5))
    assert main([str(files.root)]) == 0
    html = (files.root / "report" / "index.html").read_text()
    assert 'id="plot-curves"' in html
    assert 'id="plot-episodes"' not in html and 'id="plot-scenarios"' not in html


@pytest.mark.browser
def test_the_browser_finds_tool_episodes_in_chromium(scripted_run: Path, tmp_path: Path) -> None:
    """The tool filters, driven in headless Chromium as a user would: "with tool calls" lists
    exactly the episodes that called a tool, "with tool errors" only those whose call failed,
    and a successful tool episode opens whole (the call with its arguments, the tool's result,
    the final answer)."""
    stored = [r for f in sorted((scripted_run / "trajectories").glob("*.jsonl")) for r in rows(f)]
    called = [r for r in stored if calls_of(r)]
    failed = [r for r in stored if r.metrics.get("tool_errors", 0) > 0]
    solved = [r for r in rows(scripted_run / "trajectories" / "train_0001.jsonl") if r.correct]
    assert len(solved) == 1 and calls_of(solved[0]) and 0 < len(failed) < len(called)
    page = scripted_run / "report" / "index.html"
    calls, errors, good = browse(page, tmp_path, [
        {"f-calls": True}, {"f-errors": True},
        {"f-calls": True, "f-outcome": "correct", "f-kind": "train"},
    ])  # fmt: skip
    assert calls["count"] == f"{len(called)} of {len(stored)} rollouts"
    assert errors["count"] == f"{len(failed)} of {len(stored)} rollouts"
    assert all("1 tool error" in head for head in errors["heads"]), errors["heads"]
    assert good["count"] == f"1 of {len(stored)} rollouts"
    (name, arguments), answer = calls_of(solved[0])[0], solved[0].completion
    result = next(m.content for m in solved[0].episode if m.role == "tool")
    assert f"{name}({arguments})" in good["first"] and result in good["first"], good["first"]
    assert answer in good["first"] and "tool result: multiply" in good["first"]
