"""backend=torch|local|serverless|tinker: selection, the one-line missing-requirement errors
(checked before anything starts), and the public-API-only rule: the RL step, a GEPA evaluation
and an EI collect + distill run on a second, independently started TorchBackend that the code
under test can reach only through ART's Backend protocol."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import art
import pytest
import torch

from art_rlvr import DEFAULT_BASE_MODEL, load_scenario
from art_rlvr.backend import choose as backends
from art_rlvr.backend.choose import (
    BACKENDS,
    BackendChoice,
    BackendUnavailable,
    check_requirements,
    missing_requirements,
)
from art_rlvr.backend.torch_backend import TorchBackend
from art_rlvr.config.run_config import ConfigError, RunConfig, parse_args
from art_rlvr.ei.config import EIConfig
from art_rlvr.ei.expert import collect_round, distill_round, score_reliance
from art_rlvr.ei.hints import hinted_prompt
from art_rlvr.ei.relabel import clean_messages
from art_rlvr.gepa.adapter import ARTPromptAdapter
from art_rlvr.gepa.store import EvalStore
from art_rlvr.loops.context import RunContext
from art_rlvr.loops.rl import TrainState, train_until
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.rundir.files import RunFiles
from art_rlvr.rundir.journal import Journal

HUB_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
KEYS = ("WANDB_API_KEY", "TINKER_API_KEY")
TINKER_KEY = "tml-test-key-never-sent"


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in (*KEYS, "TINKER_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def error_line(name: str, base_model: str | None = None) -> str:
    with pytest.raises(BackendUnavailable) as info:
        check_requirements(name, base_model)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"backend={name} needs ")
    return message


# ------------------------------------------------------------------ selection


@pytest.mark.parametrize("name", ["torch", "local", "serverless", "tinker"])
def test_backend_key_takes_the_four_choices(name: str) -> None:
    assert parse_args([f"backend={name}"]).backend == name
    assert set(BACKENDS) == {"torch", "local", "serverless", "tinker"}


def test_unknown_backend_is_a_one_line_config_error() -> None:
    with pytest.raises(
        ConfigError, match=r"bad value for 'backend': 'vllm'; one of torch, .*tinker"
    ):
        parse_args(["backend=vllm"])
    assert RunConfig().backend == "torch"


def test_torch_needs_no_key_no_gpu_and_no_extra(no_keys: pytest.MonkeyPatch) -> None:
    assert missing_requirements("torch", DEFAULT_BASE_MODEL) == []
    check_requirements("torch", DEFAULT_BASE_MODEL)


# ------------------------------------------------------------------ missing requirements


def test_serverless_without_key_names_the_variable_and_how_to_set_it(
    no_keys: pytest.MonkeyPatch,
) -> None:
    message = error_line("serverless", HUB_MODEL)
    assert "WANDB_API_KEY" in message and "export WANDB_API_KEY=" in message
    no_keys.setenv("WANDB_API_KEY", "")  # empty counts as missing
    assert "WANDB_API_KEY" in error_line("serverless", HUB_MODEL)
    no_keys.setenv("WANDB_API_KEY", "test-key-never-sent")
    assert missing_requirements("serverless", HUB_MODEL) == []


def test_tinker_without_key_or_extra_names_each(no_keys: pytest.MonkeyPatch) -> None:
    message = error_line("tinker", HUB_MODEL)
    assert "export TINKER_API_KEY=" in message
    has_extra = all(backends._has_module(m) for m in ("tinker", "tinker_cookbook"))
    assert ("uv run --locked --extra tinker --no-dev" in message) is not has_extra
    no_keys.setenv("TINKER_API_KEY", "not-tinkers-shape")
    assert "starts with tml-" in error_line("tinker", HUB_MODEL)
    no_keys.setenv("TINKER_API_KEY", TINKER_KEY)
    left = missing_requirements("tinker", HUB_MODEL)
    assert not any("TINKER_API_KEY" in m for m in left)
    assert len(left) == (0 if has_extra else 1)


def test_tinker_takes_the_embedded_model_only_from_a_self_hosted_engine(
    no_keys: pytest.MonkeyPatch,
) -> None:
    no_keys.setenv("TINKER_API_KEY", TINKER_KEY)
    message = error_line("tinker", DEFAULT_BASE_MODEL)
    assert "python -m art_rlvr.backend.external.skyrl" in message and "TINKER_BASE_URL" in message
    no_keys.setenv("TINKER_BASE_URL", "http://127.0.0.1:1")
    assert not any("embedded" in m for m in missing_requirements("tinker", DEFAULT_BASE_MODEL))


@pytest.fixture
def no_service(no_keys: pytest.MonkeyPatch) -> int:
    """TINKER_BASE_URL names a loopback port nothing listens on; the port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    no_keys.setenv("TINKER_BASE_URL", f"http://127.0.0.1:{port}")
    return port


def test_a_tinker_service_that_is_not_there_is_one_line_naming_it(
    no_keys: pytest.MonkeyPatch, no_service: int
) -> None:
    """Nothing listens on the port: the line names the URL and the command that starts it."""
    port = no_service
    problem = backends.service_problem("tinker", DEFAULT_BASE_MODEL)
    assert problem is not None and "\n" not in problem
    assert f"TINKER_BASE_URL=http://127.0.0.1:{port}" in problem and "refused" in problem
    assert (
        f"art_rlvr.backend.external.skyrl --base-model {DEFAULT_BASE_MODEL} --port {port}"
        in problem
    )
    assert backends.service_problem("torch", DEFAULT_BASE_MODEL) is None
    no_keys.delenv("TINKER_BASE_URL")
    assert backends.service_problem("tinker", HUB_MODEL) is None  # Thinking Machines': not asked


async def test_a_tinker_service_that_goes_away_is_one_line_naming_the_restart(
    no_service: int,
) -> None:
    """The watch a run keeps on a self-hosted service: silent for `patience_s`, it says so."""
    port = no_service
    choice = BackendChoice(name="tinker")
    line = await asyncio.wait_for(choice.service_lost(every_s=0.05, patience_s=0.1), timeout=10)
    assert "\n" not in line and f"the Tinker service at http://127.0.0.1:{port} stopped" in line
    assert f"--base-model {DEFAULT_BASE_MODEL} --port {port}" in line


@pytest.mark.parametrize(
    ("name", "base_model", "expected"),
    [
        ("torch", DEFAULT_BASE_MODEL, None),
        ("local", HUB_MODEL, None),
        ("tinker", HUB_MODEL, {"tinker_native_args": {"training_client_args": {"rank": 8}}}),
        (
            "tinker",
            DEFAULT_BASE_MODEL,
            {
                "tinker_native_args": {
                    "training_client_args": {"rank": 8},
                    "renderer_name": "qwen3_instruct",
                }
            },
        ),
    ],
)
def test_the_model_carries_the_backends_entries_and_the_chat_template(
    name: str, base_model: str, expected: dict[str, Any] | None
) -> None:
    choice = BackendChoice(name=name, base_model=base_model, lora_rank=8)
    assert choice.internal_config() == expected
    model = choice.model_copy(update={"chat_template": "t"}).trainable_model("m", "p")
    assert model._internal_config == {**(expected or {}), "chat_template": "t"}


def test_local_names_cuda_and_the_gpu_extra_with_the_install_command() -> None:
    message = error_line("local", HUB_MODEL) if missing_requirements("local", HUB_MODEL) else ""
    if not torch.cuda.is_available():
        assert "CUDA" in message and "backend=torch" in message
    if not backends._has_module("unsloth"):
        assert "unsloth" in message and "'openpipe-art[backend]==0.5.23'" in message
        assert "--torch-backend=cu128" in message


@pytest.mark.parametrize("name", ["local", "serverless"])
def test_the_embedded_model_is_refused_on_art_backends(
    name: str, no_keys: pytest.MonkeyPatch
) -> None:
    for key in KEYS:
        no_keys.setenv(key, "test-key-never-sent")
    message = error_line(name, DEFAULT_BASE_MODEL)
    assert "embedded:SmolLM2-135M-Instruct runs on backend=torch only" in message
    assert not any("embedded" in m for m in missing_requirements(name, HUB_MODEL))


@pytest.mark.parametrize("name", ["local", "serverless", "tinker"])
def test_cli_stops_at_once_with_one_line_and_starts_nothing(name: str, tmp_path: Path) -> None:
    """The done-when check: `python -m art_rlvr.run scenario=arith backend=<name>` here."""
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    run_dir = tmp_path / "run"
    began = time.monotonic()
    argv = ["scenario=arith", f"backend={name}", f"run_dir={run_dir}"]
    proc = subprocess.run(
        [sys.executable, "-m", "art_rlvr.run", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    lines = proc.stderr.strip().splitlines()
    if proc.returncode == 0:  # pragma: no cover - a machine with every requirement met
        pytest.skip(f"backend={name} has all its requirements here")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: backend={name} needs "), lines
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not run_dir.exists()  # no run folder, no model, no server, no connection
    assert time.monotonic() - began < 60


async def test_serverless_factory_builds_arts_backend_without_connecting(
    no_keys: pytest.MonkeyPatch,
) -> None:
    """With a (fake) key the factory builds ART's ServerlessBackend; building it opens no
    connection (any non-loopback connect would fail this test)."""
    real_connect = socket.socket.connect
    attempts: list[Any] = []

    def loopback_only(self: socket.socket, address: Any) -> Any:
        if not (isinstance(address, tuple) and str(address[0]) in ("127.0.0.1", "::1")):
            attempts.append(address)
            raise OSError(f"test forbids connecting to {address}")
        return real_connect(self, address)

    no_keys.setattr(socket.socket, "connect", loopback_only)
    no_keys.setenv("WANDB_API_KEY", "test-key-never-sent")
    from art.serverless import ServerlessBackend

    backend = BackendChoice(name="serverless", base_model=HUB_MODEL).build(path="unused")
    assert isinstance(backend, ServerlessBackend)
    await backend.close()
    assert attempts == []


# ------------------------------------------------------------------ the public-API-only rule


class ProtocolOnly:
    """A real backend reachable only through ART's `art.Backend` protocol (art/backend.py):
    any other attribute (e.g. TorchBackend's `score_completions`) is an AttributeError, as it
    would be on LocalBackend, ServerlessBackend or TinkerBackend."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def _model_inference_name(self, model: art.Model, step: int | None = None) -> str:
        return self._inner._model_inference_name(model, step=step)

    async def close(self) -> None:
        await self._inner.close()

    async def register(self, model: art.Model) -> None:
        await self._inner.register(model)

    async def _get_step(self, model: art.TrainableModel) -> int:
        return await self._inner._get_step(model)

    async def _delete_checkpoint_files(
        self, model: art.TrainableModel, steps_to_keep: list[int]
    ) -> None:
        await self._inner._delete_checkpoint_files(model, steps_to_keep)

    async def _prepare_backend_for_training(
        self, model: art.TrainableModel, config: Any = None
    ) -> tuple[str, str]:
        return await self._inner._prepare_backend_for_training(model, config)

    def exact_adapter_lease(self, model: art.TrainableModel, step: int) -> Any:
        return self._inner.exact_adapter_lease(model, step)

    async def train(self, model: art.TrainableModel, groups: Any, **kwargs: Any) -> Any:
        return await self._inner.train(model, groups, **kwargs)

    def _train_sft(
        self, model: Any, trajectories: Any, config: Any, dev_config: Any, verbose: bool = False
    ) -> Any:
        return self._inner._train_sft(model, trajectories, config, dev_config, verbose)


async def test_rl_gepa_and_ei_paths_run_on_a_second_backend_through_arts_protocol(
    tmp_path: Path,
) -> None:
    inner = BackendChoice(lora_rank=8).build(path=tmp_path / "art", seed=1)
    assert isinstance(inner, TorchBackend)
    backend = ProtocolOnly(inner)
    scenario = load_scenario("arith", seed=0)
    try:
        model = art.TrainableModel(
            name="public-api", project="tests", run_name="public-api", base_model=DEFAULT_BASE_MODEL
        )
        await model.register(backend)  # type: ignore[arg-type]
        assert model.inference_base_url and model.inference_base_url.startswith("http://127.0.0.1")

        # RL: the run loop's own step (rollouts, backend.train, model.log, the run folder)
        cfg = parse_args(
            ["max_tokens=8", "groups_per_batch=2", "group_size=3", f"run_dir={tmp_path / 'rl'}"]
        )
        files = RunFiles(cfg.directory)
        ctx = RunContext(cfg, scenario, backend, model, files, time.monotonic())  # type: ignore[arg-type]
        state = await train_until(
            ctx, TrainState(), until=1, system_prompt=None, eval_at=lambda s: False
        )
        assert await model.get_step() == 1 and state.rollouts == 6
        assert model.get_inference_name() == "public-api@1"
        assert list((tmp_path / "art").glob("tests/models/*/checkpoints/*1"))

        # GEPA: a candidate evaluation as ART trajectory groups
        adapter = ARTPromptAdapter(
            model,
            EvalStore(4, Journal(tmp_path / "journal.jsonl")),
            sampling=SamplingConfig(max_tokens=8),
            group_size=2,
            seed=3,
            loop=asyncio.get_running_loop(),
        )
        evals = await adapter.aevaluate(scenario.splits["train"][:2], "Answer with a number.")
        assert len(evals) == 2 and all(0.0 <= e.score <= 1.0 for e in evals)

        # EI: collect a round, then distil it with model.train_sft
        ei = EIConfig(
            scenarios_per_round=4,
            group_size=3,
            max_tokens=10,
            sft_batch_size=4,
            sft_epochs=1,
        )
        output = await collect_round(model, scenario, ei, 0, backend=backend)
        assert output.buffer.examples, output.buffer.stats
        metrics = await distill_round(model, backend, output.buffer, ei, learning_rate=2e-4)
        assert metrics and metrics["sft_examples"] == len(output.buffer.examples)
        assert await model.get_step() == 2

        # Hint reliance needs TorchBackend's own scorer: n/a through ART's protocol, a number
        # on TorchBackend itself
        clean = list(clean_messages(scenario.splits["train"][0], None))
        pairs = [(hinted_prompt(clean, "Count carefully."), clean, "7")]
        assert await score_reliance(backend, model, pairs) is None
        scored = await score_reliance(inner, model, pairs)
        assert scored is not None and len(scored) == 1
    finally:
        await backend.close()
