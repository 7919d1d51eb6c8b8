"""The SkyRL launcher without an engine: the two wire bridges of its proxy, the engine's
command line as SkyRL's own launch parses it, and the one-line refusals before anything
starts (port taken, state folder in use). The engine itself: tests/engines/test_tinker_skyrl.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from filelock import FileLock

from art_rlvr.backend.external import skyrl


@pytest.mark.parametrize(
    ("promise", "request_body", "ids"),
    [
        ({"request_id": "7", "future_id": "7"}, {"num_samples": 3}, ["7-0", "7-1", "7-2"]),
        ({"request_id": "8"}, {}, ["8-0"]),  # num_samples absent: one sample
        ({"request_id": "9"}, {"num_samples": None}, ["9-0"]),
        ({"request_id": "5", "sample_sequence_ids": ["a", "b"]}, {"num_samples": 2}, ["a", "b"]),
    ],
)
def test_sample_promises_carry_one_id_per_sample(
    promise: dict, request_body: dict, ids: list[str]
) -> None:
    out = json.loads(
        skyrl.with_sequence_ids(json.dumps(promise).encode(), json.dumps(request_body).encode())
    )
    assert out["sample_sequence_ids"] == ids
    assert {k: v for k, v in out.items() if k != "sample_sequence_ids"} == {
        k: v for k, v in promise.items() if k != "sample_sequence_ids"
    }


@pytest.mark.parametrize(
    ("checkpoint", "listed_id"),
    [
        (
            {"checkpoint_id": "step_000001", "checkpoint_type": "training",
             "tinker_path": "tinker://model_a/weights/step_000001"},
            "weights/step_000001",
        ),
        (
            {"checkpoint_id": "step_000001", "checkpoint_type": "sampler",
             "tinker_path": "tinker://model_a/sampler_weights/step_000001"},
            "step_000001",  # SkyRL samples from tinker://<model>/<id> as listed
        ),
        (
            {"checkpoint_id": "weights/step_000002", "checkpoint_type": "training",
             "tinker_path": "tinker://model_a/weights/step_000002"},
            "weights/step_000002",  # already in the loader's form: left alone
        ),
    ],
)  # fmt: skip
def test_training_checkpoints_are_listed_as_their_path_names_them(
    checkpoint: dict, listed_id: str
) -> None:
    body = json.dumps({"checkpoints": [checkpoint]}).encode()
    (out,) = json.loads(skyrl.with_weights_ids(body))["checkpoints"]
    assert out["checkpoint_id"] == listed_id and out["tinker_path"] == checkpoint["tinker_path"]


@pytest.mark.parametrize(
    "path",
    ["/api/v1/training_runs/model_1/checkpoints", "/api/v1/models/model_1/checkpoints"],
)
def test_both_checkpoint_list_routes_are_bridged(path: str) -> None:
    assert skyrl.CHECKPOINT_LISTS.match(path)
    assert not skyrl.CHECKPOINT_LISTS.match(path + "/step_1/archive")


def test_the_engine_command_keeps_the_uv_flags_skyrl_passes_to_its_engine(tmp_path: Path) -> None:
    """SkyRL's API re-launches its engine with the `uv run` flags it reads off its parent's
    command line, up to `-m skyrl.tinker.api`: they must select our project and its extras."""
    settings = skyrl.SkyRLSettings(sample_max_num_sequences=16)
    command = skyrl.api_command(settings, "/bin/uv", 4321, "/weights", tmp_path)
    module = command.index("-m")
    assert command[:2] == ["/bin/uv", "run"] and command[module : module + 2] == [
        "-m",
        "skyrl.tinker.api",
    ]
    assert command[2:module] == [
        "--project",
        str(skyrl.ENV_PROJECT),
        "--locked",
        "--extra",
        "tinker",
        "--extra",
        "jax",
    ]
    assert (skyrl.ENV_PROJECT / "pyproject.toml").is_file() and (
        skyrl.ENV_PROJECT / "uv.lock"
    ).is_file()
    pairs = dict(zip(command[module + 2 :: 2], command[module + 3 :: 2], strict=True))
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "4321"
    assert pairs["--base-model"] == "embedded:SmolLM2-135M-Instruct"
    assert pairs["--base-model-checkpoint-path"] == "/weights" and pairs["--backend"] == "jax"
    assert json.loads(pairs["--backend-config"])["sample_max_num_sequences"] == 16
    assert pairs["--database-url"] == f"sqlite:///{tmp_path / 'tinker.db'}"


def test_the_engine_environment_is_offline_on_cpu_with_uv_on_path() -> None:
    env = skyrl.child_environment("/opt/uv/bin/uv", offline=True)
    assert env["PATH"].split(":")[0] == "/opt/uv/bin" and env["HF_HUB_OFFLINE"] == "1"
    assert env["UV_PROJECT_ENVIRONMENT"] == str(skyrl.environment_dir())
    assert env["UV_PYTHON_DOWNLOADS"] == "never" and env["JAX_PLATFORMS"] == "cpu"
    assert "VIRTUAL_ENV" not in env


def launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "art_rlvr.backend.external.skyrl", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_port_in_use_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = launch("--port", str(port), "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 2
    assert (
        done.stderr.strip() == f"error: 127.0.0.1:{port} is in use (another engine?); pass --port"
    )
    assert not (tmp_path / "state" / "engine.log").exists()  # nothing was started


def test_a_state_folder_in_use_is_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    with FileLock(str(state / "engine.lock")):
        done = launch("--port", "0", "--state-dir", str(state))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"error: another SkyRL engine keeps its state in {state}; stop it, or pass --state-dir"
    )


async def test_the_proxy_answers_while_its_callers_loop_is_blocked() -> None:
    """The tinker SDK blocks its caller's thread while it fetches its client config; the proxy
    serves from a thread of its own, so that call is answered (on the caller's loop it waited
    for its timeout: tinker-cookbook's `rl.train.main` failed so). Upstream: a scripted SkyRL
    API on loopback, behind the real proxy; the promise comes back with its sequence ids."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def asample(request: object) -> JSONResponse:
        return JSONResponse({"request_id": "3", "future_id": "3"})

    upstream = skyrl.ProxyThread(
        Starlette(routes=[Route(skyrl.SAMPLE_PATH, asample, methods=["POST"])]), skyrl.free_port()
    )
    await upstream.started()
    port = skyrl.free_port()
    proxy = skyrl.ProxyThread(
        skyrl.compat_app(f"http://127.0.0.1:{upstream.server.config.port}"), port
    )
    try:
        await proxy.started()
        answer = httpx.post(  # a blocking call on this loop's thread, as the SDK makes it
            f"http://127.0.0.1:{port}{skyrl.SAMPLE_PATH}", json={"num_samples": 2}, timeout=10
        )
        assert answer.json()["sample_sequence_ids"] == ["3-0", "3-1"]
    finally:
        await proxy.stop(10)
        await upstream.stop(10)
    assert not proxy.thread.is_alive() and not upstream.thread.is_alive()
