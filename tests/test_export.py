"""Export and serve a run's model: a real trained checkpoint, merged into a Hugging Face folder
that transformers loads and whose greedy tokens equal TorchBackend's; the same checkpoint
served by `python -m art_rlvr.serve` and queried with the OpenAI SDK; clear errors."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import art
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from art_rlvr import DEFAULT_BASE_MODEL, RunConfig, SamplingConfig, TorchBackend, gather_groups
from art_rlvr.export import MANIFEST, ValEval, pick_step, val_evals
from art_rlvr.export import main as export_main
from art_rlvr.loops.context import RunContext, run_eval
from art_rlvr.rundir.files import RunFiles
from art_rlvr.rundir.reader import RunFolder, read_run_folder
from art_rlvr.serve import main as serve_main

MAX_TOKENS = 24
CHATS = [
    [{"role": "user", "content": "What is 17 + 25? Answer with just the number."}],
    [
        {"role": "system", "content": "Reply with one word."},
        {"role": "user", "content": "Name a colour."},
    ],
    [{"role": "user", "content": "Write one sentence about rivers."}],
    [{"role": "user", "content": "List three animals, separated by commas."}],
]


@dataclass
class Trained:
    run: Path
    model: art.TrainableModel
    served: list[list[int]]  # TorchBackend's greedy completion ids at step 1, per chat
    base: list[list[int]]  # the base model's (no adapter), per chat
    prompts: list[list[int]]  # the prompt ids TorchBackend rendered, per chat


async def greedy(model: art.TrainableModel, name: str, chat: list[dict[str, str]]) -> Any:
    client = model.openai_client()
    return await client.chat.completions.create(
        model=name,
        messages=chat,
        temperature=0,
        max_tokens=MAX_TOKENS,
        extra_body={"return_token_ids": True},
    )


@pytest.fixture(scope="module")
async def trained(tmp_path_factory: pytest.TempPathFactory, scenario) -> Trained:
    """A run folder as `art_rlvr.run` leaves it: config, val evaluations at steps 0 and 1 (the
    run's own `run_eval`), and checkpoints 0 and 1 from one real training step."""
    run = tmp_path_factory.mktemp("export") / "run"
    config = RunConfig(run_name="export-rl", run_dir=run, val_limit=2, max_tokens=16)
    files = RunFiles(run)
    files.write_json("config.json", config.public_dump())
    backend = TorchBackend(path=files.art_path, seed=0)
    model = art.TrainableModel(
        name=config.name, project=config.project, run_name=config.name, base_model=config.base_model
    )
    try:
        await model.register(backend)
        ctx = RunContext(config, scenario, backend, model, files, time.monotonic())
        await run_eval(ctx, 0)
        groups = await gather_groups(
            model, scenario.splits["train"][:2], 4, sampling=SamplingConfig(max_tokens=12), seed=1
        )
        for group in groups:  # rewards forced apart: every group carries signal
            for index, trajectory in enumerate(group.trajectories):
                trajectory.reward = float(index % 2)
        result = await backend.train(model, groups, learning_rate=5e-3)
        assert result.step == 1
        await run_eval(ctx, 1)
        served, base = [], []
        for chat in CHATS:  # one at a time: each is a batch of one, like transformers' below
            served.append(await greedy(model, f"{model.name}@1", chat))
            base.append(await greedy(model, DEFAULT_BASE_MODEL, chat))
    finally:
        await backend.close()
    return Trained(
        run=run,
        model=model,
        served=[r.choices[0].model_extra["token_ids"] for r in served],
        base=[r.choices[0].model_extra["token_ids"] for r in base],
        prompts=[r.model_extra["prompt_token_ids"] for r in served],
    )


def run_module(module: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout
    )


def tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


async def test_export_round_trip_is_exact(trained: Trained, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    before = tree(trained.run)
    proc = run_module("art_rlvr.export", str(trained.run), "--out", str(out), "--step", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"step 1 (as asked) to {out}" in proc.stdout
    assert tree(trained.run) == before  # the run is only read
    names = {p.name for p in out.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        MANIFEST,
    } <= names
    assert not [n for n in names if n.startswith("adapter") or n.endswith((".py", ".pt", ".bin"))]
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "float32" and config["architectures"] == ["LlamaForCausalLM"]
    assert "auto_map" not in config  # no custom code: vLLM and transformers load it as is
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["step"] == 1 and manifest["dtype"] == "float32" and manifest["lora"]["r"] == 16

    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.dtype == torch.float32
    exported = []
    for chat, prompt in zip(CHATS, trained.prompts, strict=True):
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)
        assert ids["input_ids"] == prompt  # the same chat template, the same prompt tokens
        with torch.no_grad():
            tokens = model.generate(
                torch.tensor([prompt]), do_sample=False, max_new_tokens=MAX_TOKENS
            )
        exported.append(tokens[0, len(prompt) :].tolist())
    assert exported == trained.served  # exact: every token of every greedy completion
    assert exported != trained.base  # and the merged adapter is in there (not the base weights)


async def test_default_step_is_the_best_val_one_and_force_replaces(
    trained: Trained, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [
        json.loads(line) for line in (trained.run / "metrics.jsonl").read_text().splitlines()
    ]
    accuracy = {r["step"]: r["accuracy"] for r in records if r.get("event") == "eval"}
    assert sorted(accuracy) == [0, 1]
    best = max(accuracy, key=lambda s: (accuracy[s], s))
    out = tmp_path / "best"
    assert export_main([str(trained.run), "--out", str(out), "--dtype", "bfloat16"]) == 0
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["step"] == best and manifest["val_accuracy"] == accuracy[best]
    assert manifest["chosen_as"] == "the best of 2 val evaluation(s)"
    assert manifest["system_prompt"]  # the arith prompt the evaluation was scored with
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert export_main([str(trained.run), "--out", str(out), "--step", "0"]) == 2
    assert "not empty; pass --force" in capsys.readouterr().err
    assert json.loads((out / MANIFEST).read_text())["step"] == best  # nothing was touched
    assert export_main([str(trained.run), "--out", str(out), "--step", "0", "--force"]) == 0
    assert json.loads((out / MANIFEST).read_text())["step"] == 0
    assert [p.name for p in out.parent.iterdir()] == ["best"]  # no temporary folder left


def _config(folder: Path, **values: Any) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"mode": "rl", **values}))
    return folder


def _tinker_run(folder: Path) -> Path:
    _config(folder, backend="tinker", run_name="m", project="p")
    step = folder / ".art" / "p" / "models" / "m" / "checkpoints" / "0003"
    step.mkdir(parents=True)
    (step / "info.yaml").write_text("sampler_weights_path: tinker://run/3\n")
    return folder


def _moved_base(folder: Path, run: Path) -> Path:
    """A copy of the run whose base model folder is gone."""
    shutil.copytree(run, folder)
    config = json.loads((folder / "config.json").read_text())
    config["base_model"] = str(folder.parent / "deleted-model")
    (folder / "config.json").write_text(json.dumps(config))
    return folder


ERRORS = [
    ("absent", lambda tmp, run: [str(tmp / "nope")], "is not a run folder (no such folder)"),
    ("no config", lambda tmp, run: [str(tmp)], "is not a run folder (no config.json in it)"),
    (
        "no checkpoints",
        lambda tmp, run: [str(_config(tmp / "r", backend="serverless"))],
        "has no checkpoints (backend=serverless keeps its checkpoints on W&B)",
    ),
    (
        "weights elsewhere",
        lambda tmp, run: [str(_tinker_run(tmp / "r"))],
        "backend=tinker keeps its weights on Tinker's service",
    ),
    (
        "base model gone",
        lambda tmp, run: [str(_moved_base(tmp / "r", run))],
        "deleted-model is gone (moved or deleted?)",
    ),
    (
        "unknown step",
        lambda tmp, run: [str(run), "--step", "7"],
        "has no checkpoint for step 7; steps on disk: 0, 1",
    ),
]


@pytest.mark.parametrize(("case", "args", "message"), ERRORS, ids=[e[0] for e in ERRORS])
@pytest.mark.parametrize("command", ["export", "serve"])
def test_bad_runs_are_one_line_errors(
    trained: Trained,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    case: str,
    args: Any,
    message: str,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    argv = args(work, trained.run)
    out = tmp_path / "out"
    if command == "export":
        status = export_main([*argv, "--out", str(out)])
    else:
        status = serve_main([*argv, "--port", "0"])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("out_kind", "message"),
    [("file", "is a file; --out takes a folder"), ("not empty", "is not empty; pass --force")],
)
def test_bad_out_dirs_are_refused_before_any_work(
    trained: Trained, tmp_path: Path, capsys: pytest.CaptureFixture[str], out_kind, message
) -> None:
    out = tmp_path / "out"
    if out_kind == "file":
        out.write_text("x")
    else:
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    assert export_main([str(trained.run), "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert out.is_file() or (out / "keep.txt").read_text() == "mine"


def test_force_never_replaces_the_run_itself(
    trained: Trained, capsys: pytest.CaptureFixture[str]
) -> None:
    assert export_main([str(trained.run), "--out", str(trained.run.parent), "--force"]) == 2
    assert "holds the run itself" in capsys.readouterr().err
    assert (trained.run / "config.json").is_file()


EVALS = [
    ValEval(step=0, accuracy=0.4),
    ValEval(step=2, accuracy=0.6),
    ValEval(step=4, accuracy=0.6),
]


@pytest.mark.parametrize(
    ("evals", "steps", "requested", "step", "why"),
    [
        (EVALS, [0, 1, 2, 3, 4], None, 4, "the best of 3 val"),  # a tie: the later step
        (EVALS, [0, 1, 2, 3], None, 2, "the best of 2 val"),  # step 4 was deleted
        (EVALS, [0, 1, 2, 3, 4], 1, 1, "as asked"),
        (
            [],
            [0, 3],
            None,
            3,
            "the latest; no val evaluation",
        ),  # e.g. a GEPA run: no val evaluation records
        (EVALS, [1, 3], None, 3, "the latest; no val evaluation"),  # evaluated steps all deleted
    ],
)
def test_pick_step(evals, steps, requested, step, why) -> None:
    chosen, reason = pick_step(evals, steps, requested)
    assert chosen == step and why in reason


def run_with(root: Path, mode: str, events: list[dict[str, Any]], state: Any = None) -> RunFolder:
    """A run folder holding `events` (val / test evaluations and a train step) and a state."""
    (root / "config.json").write_text(json.dumps({"mode": mode}))
    (root / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    if state is not None:
        (root / "state.json").write_text(json.dumps(state))
    return read_run_folder(root)


def evaluation(split: str, step: int, accuracy: float, **more: Any) -> dict[str, Any]:
    return {"event": "eval", "split": split, "step": step, "accuracy": accuracy} | {
        "reward_mean": accuracy,
        **more,
    }


def test_expert_iteration_evals_map_rounds_to_model_steps(tmp_path: Path) -> None:
    events = [
        evaluation("val", 0, 0.3),
        evaluation("val", 2, 0.5),  # round 2
        evaluation("test", 2, 0.9),
        {"event": "train", "step": 5, "reward_mean": 0.5, "accuracy": 0.5},
    ]
    state = {"eval_steps": {"0": 0, "2": 6}}
    (tmp_path / "ei").mkdir()
    (tmp_path / "rl").mkdir()
    ei = run_with(tmp_path / "ei", "ei", events, state)
    assert [(e.step, e.accuracy) for e in val_evals(ei)] == [(0, 0.3), (6, 0.5)]
    assert [e.step for e in val_evals(run_with(tmp_path / "rl", "rl", events))] == [0, 2]


def test_expert_iteration_evals_carry_their_step_and_round(tmp_path: Path) -> None:
    """Since evaluations carry their round, `step` is the model's; the trajectories file (and
    the prompt read from it) is still named by the round: here a file of the layout before."""
    (tmp_path / "trajectories").mkdir()
    row = {"messages": [{"role": "system", "content": "Round two's prompt."}], "completion": "4"}
    (tmp_path / "trajectories" / "val_0002.jsonl").write_text(json.dumps(row) + "\n")
    events = [evaluation("val", 0, 0.3, round=0), evaluation("val", 1, 0.5, round=2)]
    state = {"eval_steps": {"0": 0, "2": 7}}  # ignored: the events say their step
    evals = val_evals(run_with(tmp_path, "ei", events, state))
    assert [(e.step, e.accuracy, e.system_prompt) for e in evals] == [
        (0, 0.3, None),
        (1, 0.5, "Round two's prompt."),
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stdout_lines(proc: subprocess.Popen) -> queue.Queue[str | None]:
    """The process's stdout lines as they come (None at its end), read by a thread: a select
    on the pipe would miss lines already in the reader's buffer."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def read_until(lines: queue.Queue[str | None], marker: str, timeout: float) -> list[str]:
    """Lines up to and including the first that holds `marker`."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if marker in line:
            return seen
    raise AssertionError(f"no {marker!r} from serve within {timeout}s: {seen}")


def start_serve(trained: Trained, port: int, err_path: Path) -> subprocess.Popen:
    env = {**os.environ, "ART_RLVR_SERVE_KEY": "test-key"}
    with err_path.open("w") as err:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "art_rlvr.serve",
                str(trained.run),
                "--step",
                "1",
                "--port",
                str(port),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
        )


def test_serve_answers_the_openai_sdk_and_stops_on_ctrl_c(trained: Trained, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "serve.err"
    before = tree(trained.run)
    proc = start_serve(trained, port, log)
    try:
        output = stdout_lines(proc)
        text = "\n".join(read_until(output, "Ctrl-C", timeout=600))
        base_url = f"http://127.0.0.1:{port}/v1"
        assert f"base URL  {base_url}" in text and "from $ART_RLVR_SERVE_KEY" in text
        assert "test-key" not in text  # a key from the environment is never echoed
        client = openai.OpenAI(base_url=base_url, api_key="test-key", max_retries=0)
        assert "export-rl@1" in [m.id for m in client.models.list().data]
        for name, chat, expected in [
            ("export-rl", CHATS[0], trained.served[0]),
            ("export-rl@1", CHATS[2], trained.served[2]),
        ]:
            reply = client.chat.completions.create(
                model=name,
                messages=chat,
                temperature=0,
                max_tokens=MAX_TOKENS,
                extra_body={"return_token_ids": True},
            )
            assert reply.choices[0].model_extra["token_ids"] == expected
            assert reply.choices[0].message.content
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert read_until(output, "stopped", timeout=10)[-1] == "stopped"
    assert "Traceback" not in log.read_text()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 2):
        pass
    assert tree(trained.run) == before  # the run folder is only read


def test_serve_exits_promptly_on_sigterm_while_clients_hold_connections(
    trained: Trained, tmp_path: Path
) -> None:
    """SIGTERM with idle connections, half-sent requests and a long generation in flight:
    `serve` exits 0 within seconds (on e6a4417 it printed "stopped" and took ~45 s to exit;
    uvicorn waited on every connection without a bound, then the interpreter's teardown
    walked every object torch made)."""
    port = free_port()
    log = tmp_path / "serve.err"
    proc = start_serve(trained, port, log)
    held: list[socket.socket] = []
    try:
        output = stdout_lines(proc)
        read_until(output, "Ctrl-C", timeout=600)
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        for sock in held[:5]:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="test-key")
        stream = client.chat.completions.create(
            model="export-rl",
            messages=CHATS[2],
            max_tokens=1900,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        next(iter(stream))  # a generation is under way
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=120)
        seconds = time.monotonic() - started
    finally:
        for sock in held:
            sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert status == 0, log.read_text()[-2000:]
    assert read_until(output, "stopped", timeout=10)[-1] == "stopped"
    assert seconds < 20, seconds  # 5 s of grace for the stream, then the engine stops
    assert "Traceback" not in log.read_text()
