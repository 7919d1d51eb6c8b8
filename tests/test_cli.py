"""The CLI end to end in subprocesses: eval, a tiny RL run, and SIGKILL + resume."""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from art_rlvr.rundir.stored import read_trajectories

TINY = [
    "scenario=arith",
    "max_tokens=8",
    "val_limit=6",
    "eval_test=false",
    "groups_per_batch=2",
    "group_size=2",
]


def run_cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "art_rlvr.run", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_eval_writes_summary_config_and_trajectories(tmp_path: Path) -> None:
    run_dir = tmp_path / "eval"
    proc = run_cli(*TINY, "mode=eval", f"run_dir={run_dir}", "seed=3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mode"] == "eval" and summary["scenario"] == "arith" and summary["steps"] == 0
    assert summary["val_accuracy_before"] == summary["val_accuracy_after"]
    assert 0.0 <= summary["val_accuracy_before"] <= 1.0 and summary["wall_seconds"] > 0
    config = json.loads((run_dir / "config.json").read_text())
    assert config["seed"] == 3 and config["mode"] == "eval" and "versions" in config
    rows = read_trajectories(run_dir / "trajectories" / "val_0000.jsonl")
    assert len(rows) == 6 and rows[0].completion and rows[0].feedback
    assert [(r.meta_int("sample"), r.meta_int("seed") is not None) for r in rows] == 6 * [(0, True)]
    (val_line,) = [line for line in proc.stdout.splitlines() if line.startswith("val acc")]
    assert "->" not in val_line  # an evaluation trains nothing: one number, not 0.5 -> 0.5
    assert "Warning" not in proc.stderr  # peft's FutureWarning is silenced (art_rlvr/__init__)
    assert "mode: evaluation only" in (run_dir / "run.log").read_text()
    (event,) = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # both clocks: CPU seconds stay comparable when the machine is shared (learning_curve.py)
    assert event["event"] == "eval" and event["cpu_seconds"] > 0 and event["wall_seconds"] > 0


def train_steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if '"event": "train"' in line]


def checkpoints(run_dir: Path) -> list[str]:
    folder = next((run_dir / ".art").glob("*/models/*/checkpoints"))
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.slow  # 2026-12-02: 130 s of the default suite on 2 AVX2 cores, which went past 30 minutes; `uv run pytest -m slow`
@pytest.mark.parametrize("kill_seed", [0])
def test_rl_survives_sigkill_and_resumes_without_lost_or_repeated_steps(
    tmp_path: Path, kill_seed: int
) -> None:
    run_dir = tmp_path / "rl"
    args = [*TINY, "n_batches=4", "eval_every=2", f"run_dir={run_dir}", "learning_rate=1e-4",
            "lr_schedule=linear"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "art_rlvr.run", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    target = random.Random(kill_seed).choice(
        [1, 2]
    )  # kill once this checkpoint exists, plus jitter
    deadline = time.monotonic() + 300
    ckpt_root = run_dir / ".art"
    while time.monotonic() < deadline and proc.poll() is None:
        done = list(ckpt_root.glob(f"*/models/*/checkpoints/{target:04d}"))
        if done:
            time.sleep(random.Random(kill_seed).uniform(0.0, 1.5))
            break
        time.sleep(0.05)
    assert proc.poll() is None, "run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = train_steps(run_dir)
    assert len(killed_at) == len(set(killed_at))
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4
    steps = train_steps(run_dir)
    assert len(steps) == len(set(steps)) and set(steps) <= {1, 2, 3, 4} and steps == sorted(steps)
    assert {3, 4} <= set(steps)
    assert checkpoints(run_dir) == ["0000", "0001", "0002", "0003", "0004"]
    assert summary["val_accuracy_before"] is not None and summary["val_accuracy_after"] is not None
    assert "resuming at step" in (run_dir / "run.log").read_text()
    events = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = {e["step"]: e["train/learning_rate"] for e in events if e["event"] == "train"}
    # linear decay over the 4 steps, each at its own rate after the resume too
    assert rates == pytest.approx({s: 1e-4 * (5 - s) / 4 for s in steps}, rel=1e-12)


def sampled_and_trained(run_dir: Path) -> tuple[list, list]:
    """Every sampled token and logprob of a run's training rollouts, by file and position,
    and each step's training figures (loss, gradient norm, importance ratio)."""
    sampled = [
        [
            (choice["token_ids"], [t["logprob"] for t in choice["logprobs"]["content"]])
            for group in map(json.loads, path.read_text().splitlines())
            for trajectory in group["trajectories"]
            for choice in trajectory["messages_and_choices"]
            if "logprobs" in choice
        ]
        for path in sorted((run_dir / "trajectories").glob("train_*.jsonl"))
    ]
    events = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [
        [e[f"train/{key}"] for key in ("loss", "grad_norm", "ratio_mean")]
        for e in events
        if e["event"] == "train"
    ]
    return sampled, trained


@pytest.mark.slow  # 2026-12-02: 174 s of the default suite on 2 AVX2 cores, which went past 30 minutes; `uv run pytest -m slow`
def test_two_seeded_runs_started_together_sample_and_train_the_same_bits(tmp_path: Path) -> None:
    """The same seed, two runs at once on the same cores: every sampled token and logprob and
    every step's loss and gradient norm are equal bit for bit. The load makes each run's
    threads meet in other orders; a gradient summed in thread order had made two such runs
    part at step 2 or 3 (docs/results.md, 2026-11-27)."""
    args = [
        "scenario=arith",
        "n_batches=3",
        "groups_per_batch=3",
        "group_size=6",
        "max_tokens=24",
        "val_limit=2",
        "eval_every=8",
        "eval_test=false",
        "learning_rate=1e-4",
    ]
    runs = [tmp_path / name for name in ("a", "b")]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "art_rlvr.run", *args, f"run_dir={run}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run in runs
    ]
    for proc in procs:
        _, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-2000:]
    (sampled_a, trained_a), (sampled_b, trained_b) = map(sampled_and_trained, runs)
    assert len(sampled_a) == 3 and all(len(step) == 18 for step in sampled_a)
    assert len(trained_a) == 3 and any(norm > 0 for _, norm, _ in trained_a)
    assert sampled_a == sampled_b
    assert trained_a == trained_b


def test_the_error_is_the_last_line_when_a_gather_left_its_bar_open(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """ART's gather closes its progress bar only when it completes: a run stopped mid-gather
    (the Tinker service gone, 2026-12-02) printed the bar after its one-line error."""
    from tqdm import auto as tqdm

    from art_rlvr.run import finish

    bar = tqdm.tqdm(desc="batch 1", total=2)  # as art.gather_trajectory_groups opens it
    bar.update(0)
    assert finish("error: backend=tinker: gone", None, code=2) == 2
    assert capsys.readouterr().err.splitlines()[-1] == "error: backend=tinker: gone"
    del bar


def test_corrupt_state_file_is_a_clear_error(tmp_path: Path) -> None:
    run_dir = tmp_path / "bad"
    run_dir.mkdir()
    (run_dir / "state.json").write_text('{"evals": {"0": 0.')
    proc = run_cli(*TINY, "n_batches=1", f"run_dir={run_dir}")
    assert proc.returncode == 2
    assert "state.json is corrupt" in proc.stderr and "Traceback" not in proc.stderr


LOOPBACK_ONLY = Path(__file__).parent / "scripts" / "loopback_only.py"


def test_the_guard_blocks_and_records_a_lookup_elsewhere(tmp_path: Path) -> None:
    """The guard below is only worth something if it catches a name that is not loopback."""
    log = tmp_path / "outbound.log"
    code = "import socket\ntry:\n    socket.getaddrinfo('example.invalid', 443)\nexcept ConnectionRefusedError:\n    print('refused')\nsocket.getaddrinfo('127.0.0.1', 80)"
    proc = subprocess.run(
        [sys.executable, str(LOOPBACK_ONLY), str(log), "-c", code], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "refused"
    assert log.read_text().splitlines() == ["socket.getaddrinfo example.invalid"]


WEAVE_REPORT = """
import art_rlvr  # sets the default before weave is imported
from weave.telemetry.trace_sentry import global_trace_sentry as reporter
reporter.exception(RuntimeError("a failure weave would report"))
reporter.end_session()
"""


@pytest.mark.parametrize(
    "setting, reported",
    [(None, False), ("false", False), ("true", True)],  # true: the user opted in
)
def test_weave_error_reports_stay_on_the_machine_unless_opted_in(
    tmp_path: Path, setting: str | None, reported: bool
) -> None:
    """weave, which ART imports, sends errors and a session to sentry.io; art_rlvr turns that
    off by default (WANDB_ERROR_REPORTING=false). The guard refuses the lookup either way."""
    log = tmp_path / "outbound.log"
    env = {k: v for k, v in os.environ.items() if k != "WANDB_ERROR_REPORTING"}
    if setting is not None:
        env["WANDB_ERROR_REPORTING"] = setting
    proc = subprocess.run(
        [sys.executable, str(LOOPBACK_ONLY), str(log), "-c", WEAVE_REPORT],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = log.read_text().splitlines() if log.exists() else []
    assert bool(lines) == reported, lines
    assert all("sentry.io" in line for line in lines)


def test_a_run_connects_to_loopback_only(tmp_path: Path) -> None:
    """A training run, from import to exit, looks up and connects to nothing but 127.0.0.1."""
    log, run_dir = tmp_path / "outbound.log", tmp_path / "rl"
    env = {k: v for k, v in os.environ.items() if k != "WANDB_ERROR_REPORTING"}
    proc = subprocess.run(
        [sys.executable, str(LOOPBACK_ONLY), str(log), "-m", "art_rlvr.run",
         *TINY, "n_batches=1", f"run_dir={run_dir}"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 1
    assert not log.exists(), log.read_text()


def test_versions_of_a_checkout_run_from_source_are_recorded_not_fatal() -> None:
    """config.json records package versions; run from a checkout on PYTHONPATH (as on the GPU
    machine) art-rlvr has no installed metadata, which used to stop the run."""
    from art_rlvr.loops.evaluate import package_version

    assert package_version("no-such-distribution-art-rlvr") == "not installed (run from source)"
    assert package_version("pydantic")[0].isdigit()


RESUME = "interrupted; re-run the same command to resume"


def interrupt(args: list[str], presses: int, after: str) -> tuple[int, float, list[str]]:
    """Start the CLI, wait for `after` in its output, press Ctrl-C `presses` times (SIGINT to
    its process group, as a terminal does); (exit code, seconds to exit, lines after it)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "art_rlvr.run", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            lines.extend(raw.decode(errors="replace").replace("\r", "\n").splitlines())
            if any(after in line for line in lines[-5:]):
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert seen.wait(600), "\n".join(lines[-30:])
    time.sleep(1.0)
    mark, sent = len(lines), time.monotonic()
    for _ in range(presses):
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)
    code = proc.wait(timeout=120)
    took = time.monotonic() - sent
    reader.join(timeout=10)
    return code, took, [line for line in lines[mark:] if line.strip()]


@pytest.mark.parametrize(
    "presses", [1, pytest.param(2, marks=pytest.mark.slow)], ids=["once", "twice"]
)
def test_ctrl_c_stops_in_seconds_says_how_to_resume_last_and_resumes(
    tmp_path: Path, presses: int
) -> None:
    """Ctrl-C during a run: no traceback (the server answers what is in flight and closes),
    exit 130 within seconds (0.3-0.7 s measured; a second press quits at once), the resume line
    last on the console and in run.log; the same command then finishes the run, no step twice."""
    run_dir = tmp_path / "rl"
    args = [*TINY, "n_batches=3", "eval_every=10", f"run_dir={run_dir}"]
    code, took, after = interrupt(args, presses, "step 1/3")
    assert code == 130 and took < 15, (code, took, after[-20:])
    assert after and after[-1] == RESUME, after[-20:]
    assert not [line for line in after if "Traceback" in line or "Exception in ASGI" in line]
    assert not [line for line in after if "exceptions=" in line]  # no bar redrawn per rollout
    assert (run_dir / "run.log").read_text().splitlines()[-1] == RESUME
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    steps = train_steps(run_dir)
    assert steps == sorted(set(steps)) == [1, 2, 3]


def test_ctrl_c_while_art_and_torch_load_stops_at_once(tmp_path: Path) -> None:
    """Ctrl-C a second after the first line, while ART and torch are still being imported
    (~15 s of CPU): the run stops in seconds (it took ~30 s, the imports' end), resume line
    last on the console and in run.log."""
    run_dir = tmp_path / "early"
    args = [*TINY, "mode=eval", f"run_dir={run_dir}"]
    code, took, after = interrupt(args, 1, "(loading ART, torch and the model)")
    assert code == 130 and took < 5, (code, took, after[-20:])
    assert after[-1] == RESUME and not [line for line in after if "Traceback" in line], after
    assert (run_dir / "run.log").read_text().splitlines()[-1] == RESUME


@pytest.mark.parametrize(
    ("env", "prefix"),
    [({"UV": "/usr/bin/uv"}, "uv run python"), ({}, "python")],
    ids=["uv", "plain"],
)
def test_the_end_screen_commands_run_as_printed(
    env: dict[str, str], prefix: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Under `uv run` the printed commands start `uv run python`; from an activated venv or a
    system Python, `python`; from a venv's interpreter called by path, that path."""
    from art_rlvr.run import next_steps, python_command

    monkeypatch.delenv("UV", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)  # as if activated
    assert python_command() == prefix
    lines = next_steps(tmp_path / "runs" / "a b", trained=True)
    assert f"  report   {prefix} -m art_rlvr.report '{tmp_path}/runs/a b'" in lines
    assert any("-m art_rlvr.export" in line and "--out exported/'a b'" in line for line in lines)
    monkeypatch.delenv("UV", raising=False)
    monkeypatch.delenv("VIRTUAL_ENV")
    if sys.prefix != sys.base_prefix:  # this venv, not activated: its interpreter by path
        assert python_command().endswith("python") and python_command() != "python"


def test_the_entry_points_answer_before_the_heavy_imports() -> None:
    """`run` prints its first line (and `--help`, and any config error) before ART or torch
    load; `report` and `compare` never load them."""
    probe = (
        "import sys, art_rlvr.run, art_rlvr.report.__main__, art_rlvr.compare\n"
        "print(sorted({'art', 'torch', 'transformers', 'openai'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


async def test_a_base_model_that_cannot_load_is_one_line(backend, tmp_path: Path) -> None:
    """A folder with a config and a tokenizer but no weights passes the checks made before
    anything loads; when TorchBackend then fails to load it, the run stops with one line naming
    base_model (main prints it, exit 2), not with a crash report."""
    import art

    from art_rlvr import DEFAULT_BASE_MODEL
    from art_rlvr.backend.adapters.model_source import base_model_problem, resolve_base_model
    from art_rlvr.config.run_config import ConfigError, parse_args
    from art_rlvr.run import register

    folder = tmp_path / "no-weights"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes(
            (Path(resolve_base_model(DEFAULT_BASE_MODEL)) / name).read_bytes()
        )
    assert base_model_problem(str(folder)) is None
    cfg = parse_args([f"base_model={folder}"])
    model = art.TrainableModel(
        name=f"noweights-{tmp_path.name}", project="p", run_name="r", base_model=str(folder)
    )
    with pytest.raises(ConfigError) as error:
        await register(model, backend, cfg)
    message = str(error.value)
    assert message.startswith(f"base_model={folder}: ") and "model.safetensors" in message
    assert "\n" not in message
