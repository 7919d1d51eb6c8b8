"""Watching a run: Weave traces against a recording trace server on loopback, the alarms
(reward hacking, early stop on a plateau) and the end-of-run summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from art_rlvr.observe.alarms import plateaued, reward_hacking
from art_rlvr.observe.tracing import setup_weave, tracing_active
from art_rlvr.run import summary_lines
from art_rlvr.rundir.events import RunSummary
from art_rlvr.testing import ScriptedServer, Step
from art_rlvr.testing.trace_server import RecordingTraceServer

W_KEY = "wandb-fake-key-7f3a9c1e5b2d4f6a8c0e2b4d6f8a0c2e4b6d8f0a"  # 40+ chars, distinctive
LLM_KEY = "sk-llm-fake-key-distinctive-4242"
PROMPT = "You are a careful calculator. Reply with only the final number."


@pytest.mark.parametrize(
    ("evals", "rewards", "alarm"),
    [
        ({0: 0.5, 4: 0.4, 8: 0.3}, {s: 0.3 if s <= 4 else 0.6 for s in range(1, 9)}, True),
        ({0: 0.5, 4: 0.4, 8: 0.45}, {s: 0.3 if s <= 4 else 0.6 for s in range(1, 9)}, False),
        ({0: 0.5, 4: 0.4, 8: 0.3}, {s: 0.3 for s in range(1, 9)}, False),  # reward flat
        ({0: 0.5, 4: 0.3}, {s: 0.1 * s for s in range(1, 5)}, False),  # nothing before step 0
        ({0: 0.5}, {}, False),
    ],
)
def test_reward_hacking_alarm(evals: dict, rewards: dict, alarm: bool) -> None:
    found = reward_hacking(evals, rewards, min_rise=0.05, min_drop=0.05)
    assert (found is not None) == alarm
    if alarm:
        assert found.step == max(evals) and "reward hacking" in found.message


@pytest.mark.parametrize(
    ("evals", "patience", "stop"),
    [
        ([0.4, 0.6, 0.58, 0.59], 2, True),
        ([0.4, 0.6, 0.58, 0.61], 2, False),
        ([0.4, 0.6, 0.58], 2, False),  # the best is inside the window: not a plateau yet
        ([0.4, 0.4], 1, True),
        ([0.4], 1, False),
    ],
)
def test_plateau_early_stop(evals: list[float], patience: int, stop: bool) -> None:
    found = plateaued({i * 4: v for i, v in enumerate(evals)}, patience)
    assert (found is not None) == stop


def test_summary_lines_name_the_numbers_and_the_alarms(tmp_path: Path) -> None:
    summary = {
        "mode": "rl",
        "scenario": "arith",
        "seed": 3,
        "val_accuracy_before": 0.4,
        "val_accuracy_after": 0.55,
        "test_accuracy_after": 0.5,
        "steps": 8,
        "rollouts": 288,
        "training_tokens": 4000,
        "wall_seconds": 61.0,
        "peak_rss_mb": 900.0,
        "alarms": [{"kind": "reward_hacking", "step": 8, "message": "possible reward hacking"}],
        "early_stop": {"kind": "early_stop", "step": 8, "message": "no progress; stopping"},
    }
    text = "\n".join(summary_lines(RunSummary.model_validate(summary), tmp_path))
    for expected in ("0.400 -> 0.550", "test acc   0.500", "288", "ALARM", "stopping"):
        assert expected in text
    assert f"python -m art_rlvr.report {tmp_path}" in text


def run_cli(args: list[str], env: dict[str, str], run_dir: Path) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "art_rlvr.run", f"run_dir={run_dir}", *args]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def weave_env(trace: RecordingTraceServer | None, url: str | None = None) -> dict[str, str]:
    """Weave pointed at loopback only: the trace server, W&B's API and no error reporting."""
    env = {k: v for k, v in os.environ.items() if k != "WEAVE_DISABLED"}
    base = url or (trace.url if trace else "http://127.0.0.1:9")
    return env | {
        "WF_TRACE_SERVER_URL": f"{base}/traces",
        "WANDB_BASE_URL": base,
        "WANDB_API_KEY": W_KEY,
        "WANDB_ERROR_REPORTING": "false",
        "OBSERVE_LLM_KEY": LLM_KEY,
    }


TINY_SCHEDULE = [
    "scenario=arith",
    "mode=gepa_rl_ei",
    "system_prompt=Answer the question.",
    "max_tokens=12",
    "temperature=0",
    "val_limit=3",
    "eval_test=false",
    "groups_per_batch=2",
    "group_size=2",
    "rounds=1",
    "rl_batches_per_round=1",
    "max_metric_calls=12",
    "max_iterations=1",
    "pareto_size=4",
    "traces_per_iteration=2",
    "gepa.group_size=1",
    "min_improvement_threshold=-1",
    "report_val_limit=0",
    "scenarios_per_round=2",
    "enable_teacher_hints=true",
]


def scripted_llm_args(server: ScriptedServer) -> list[str]:
    return [
        "reflection.model=openai/scripted",
        f"reflection.api_base={server.base_url}",
        "reflection.api_key_env=OBSERVE_LLM_KEY",
        "teacher.model=openai/scripted",
        f"teacher.api_base={server.base_url}",
        "teacher.api_key_env=OBSERVE_LLM_KEY",
    ]


@pytest.mark.slow  # 2026-12-02: 106 s of the default suite on 2 AVX2 cores, which went past 30 minutes; `uv run pytest -m slow`
def test_weave_traces_every_kind_of_work_and_no_secret(tmp_path: Path) -> None:
    with (
        RecordingTraceServer() as trace,
        ScriptedServer([], default=Step.reply(f"```\n{PROMPT}\n```")) as llm,
    ):
        run_cli(
            [*TINY_SCHEDULE, *scripted_llm_args(llm), "weave_project=tester/art-rlvr"],
            weave_env(trace),
            tmp_path,
        )
        calls = trace.calls()
        bodies = json.dumps([r.body for r in trace.requests], default=str)
    by_name: dict[str, list[dict]] = {}
    for call in calls:
        by_name.setdefault(call["name"], []).append(call)
    for name in (
        "art_rlvr.rollout",
        "art_rlvr.score",
        "art_rlvr.evaluate",
        "art_rlvr.rl_step",
        "art_rlvr.gepa.iteration",
        "art_rlvr.llm",
        "art_rlvr.ei.round",
        "art_rlvr.ei.hint",
    ):
        assert by_name.get(name), f"no {name} call reached the trace server: {sorted(by_name)}"
    rollout = by_name["art_rlvr.rollout"][0]
    assert rollout["inputs"]["scenario_id"].startswith("arith-")
    assert rollout["inputs"]["prompt_hash"] and rollout["inputs"]["messages"]
    assert set(rollout["output"]) >= {"completion", "reward", "feedback"}
    # nesting: a score sits under its rollout, rollouts under a step / evaluation / round
    ids = {c["id"]: c["name"] for c in calls}
    assert {ids.get(c["parent_id"]) for c in by_name["art_rlvr.score"]} == {"art_rlvr.rollout"}
    parents = {ids.get(c["parent_id"]) for c in by_name["art_rlvr.rollout"]}
    assert parents >= {"art_rlvr.rl_step", "art_rlvr.evaluate", "art_rlvr.ei.round"}
    llm_roles = {c["inputs"]["role"] for c in by_name["art_rlvr.llm"]}
    assert any("reflect" in r for r in llm_roles) and any("teacher" in r for r in llm_roles)
    step = by_name["art_rlvr.rl_step"][0]
    assert step["output"]["step"] == 1 and "reward_mean" in step["output"]
    # the trainable model's own client is not traced a second time (the reflector's and the
    # teacher's HTTP calls may be: weave's litellm integration nests them under art_rlvr.llm)
    parent = {c["id"]: c["parent_id"] for c in calls}

    def ancestors(call_id: str | None) -> list[str]:
        chain = []
        while call_id in parent:
            call_id = parent[call_id]
            chain.append(ids.get(call_id))
        return chain

    http = [c for c in calls if c["name"].startswith(("openai", "litellm"))]
    assert all("art_rlvr.llm" in ancestors(c["id"]) for c in http)
    assert not [c for c in http if "art_rlvr.rollout" in ancestors(c["id"])]
    assert W_KEY not in bodies and LLM_KEY not in bodies
    # nor in any file the run wrote: config, logs, trajectories, GEPA/EI state, checkpoints
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert any(f.suffix == ".safetensors" for f in files) and len(files) > 20
    leaked = [f for f in files if any(k.encode() in f.read_bytes() for k in (W_KEY, LLM_KEY))]
    assert leaked == []
    assert "tracing: on" in (tmp_path / "run.log").read_text()


@pytest.mark.parametrize(
    ("project", "key", "server", "expected"),
    [
        (None, W_KEY, "up", "weave tracing: off (set weave_project"),
        ("tester/x", None, "up", "no W&B key"),
        ("tester/x", W_KEY, "gone", "unreachable ("),
    ],
)
def test_tracing_stays_off_and_says_why_once(
    project: str | None,
    key: str | None,
    server: str,
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No project, no key or no trace server: one line says why, weave is never started."""
    with RecordingTraceServer() as trace:
        env = weave_env(trace)
        if server == "gone":
            trace.close()  # a loopback port that no longer answers
        env = {k: v for k, v in env.items() if k != "WANDB_API_KEY" or key}
        for name in ("WF_TRACE_SERVER_URL", "WANDB_BASE_URL", "WANDB_API_KEY", "HOME"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc either
        with caplog.at_level("INFO", logger="art_rlvr.observe.tracing"):
            assert setup_weave(project) is False
        requests = trace.requests
    lines = [r.getMessage() for r in caplog.records if "weave tracing" in r.getMessage()]
    assert len(lines) == 1 and expected in lines[0]
    assert not tracing_active()
    assert server == "gone" or requests == []  # the probe is the only request ever made


@pytest.mark.slow  # 2026-12-02: 109 s of the default suite on 2 AVX2 cores, which went past 30 minutes; `uv run pytest -m slow`
def test_patience_stops_a_plateaued_run_and_a_rerun_stays_stopped(tmp_path: Path) -> None:
    args = [
        "mode=rl",
        "n_batches=6",
        "eval_every=1",
        "patience=1",
        "learning_rate=1e-9",  # the weights barely move, so val accuracy stays flat
        "groups_per_batch=2",
        "group_size=2",
        "val_limit=3",
        "eval_test=false",
        "max_tokens=8",
    ]
    with RecordingTraceServer() as trace:  # weave is configured, but no weave_project is set
        env = weave_env(trace)
        done = run_cli(args, env, tmp_path)
        assert trace.requests == []  # a run without weave_project sends nothing
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["early_stop"]["step"] == 1
    assert "stopped" in done.stdout
    events = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "early_stop"] == [1]
    run_cli(args, env, tmp_path)  # resuming a stopped run does not train on
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 1


OFFLINE = """
import asyncio
from art_rlvr.observe.tracing import finish_weave, setup_weave
from art_rlvr.scenarios.scenario import load_scenario
assert setup_weave("ent/proj", offline=True)
scenario = load_scenario("arith").splits["val"][0]
asyncio.run(scenario.score(str(scenario.x["answer"])))
finish_weave()
"""
LOOPBACK_ONLY = Path(__file__).parents[1] / "scripts" / "loopback_only.py"


def test_offline_traces_record_with_nothing_online_and_upload_later(tmp_path: Path) -> None:
    """`weave_offline`: no key, no trace server, not even a lookup off the machine (weave's
    PyPI version check included) while weave records the calls into its on-disk log; the
    upload command then sends them, once, to a trace server (here a recording one on
    loopback) with the user's key."""
    gone = ("WANDB_API_KEY", "WF_TRACE_SERVER_URL", "WANDB_BASE_URL", "WEAVE_DISABLED")
    env = {k: v for k, v in os.environ.items() if k not in gone}
    env |= {"HOME": str(tmp_path), "WANDB_ERROR_REPORTING": "false"}  # the log is under HOME
    outbound = tmp_path / "outbound.log"
    proc = subprocess.run(
        [sys.executable, str(LOOPBACK_ONLY), str(outbound), "-c", OFFLINE],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not outbound.exists(), outbound.read_text()
    (folder,) = (tmp_path / ".weave" / "wal" / "ent" / "proj").iterdir()
    records = [json.loads(line) for f in folder.glob("*.jsonl") for line in f.open()]
    starts = [r["req"]["start"] for r in records if r["type"] == "call_start"]
    assert [s["op_name"].split("/")[-1].split(":")[0] for s in starts] == ["art_rlvr.score"]
    assert all(s["project_id"] == "ent/proj" for s in starts)

    def send() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "art_rlvr.observe.upload", "ent/proj",
             "--trace-server-url", f"{trace.url}/traces"],
            capture_output=True, text=True, timeout=300,
            env=env | {"WANDB_API_KEY": W_KEY, "WANDB_BASE_URL": trace.url},
        )  # fmt: skip

    with RecordingTraceServer() as trace:
        first, again = send(), send()
        calls = trace.calls()
    assert first.returncode == 0 and first.stdout.startswith("sent "), first.stderr[-3000:]
    assert [c["name"] for c in calls] == ["art_rlvr.score"]
    assert calls[0]["output"]["reward"] == 1.0 and calls[0]["ended_at"]
    assert again.returncode == 2 and "no offline traces of ent/proj" in again.stderr
