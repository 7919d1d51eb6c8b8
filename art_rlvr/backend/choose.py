"""Which ART backend runs a run: `backend=torch|local|serverless|tinker`, as a `BackendChoice`.

`BackendChoice.check()` runs before anything heavy starts (no model load, no server, no
connection but one question to a self-hosted Tinker service): a missing requirement is a
`BackendUnavailable` with one line naming what is missing and the command that installs or sets
it. `BackendChoice.build(...)` then constructs the backend through ART's public constructors:

- `torch`: art_rlvr's `TorchBackend` (embedded model, CPU or one CUDA GPU, no key);
- `local`: `art.local.LocalBackend` (unsloth training + ART's managed vLLM runtime on this
  machine's NVIDIA GPUs);
- `serverless`: `art.serverless.ServerlessBackend` (W&B Training; `WANDB_API_KEY`);
- `tinker`: ART's `TinkerNativeBackend` with supervised steps (`external.tinker`), on Thinking
  Machines' Tinker or on a self-hosted Tinker-API engine at `TINKER_BASE_URL` (a local SkyRL:
  `python -m art_rlvr.backend.external.skyrl`); `TINKER_API_KEY`.

Requirements were read from openpipe-art 0.5.23: `LocalBackend` imports torch at module level
and unsloth when its training service starts, and installs its vLLM runtime with the `uv`
executable on first use (or takes `ART_VLLM_RUNTIME_BIN`); `ServerlessBackend`'s client raises
without `WANDB_API_KEY`; `TinkerNativeBackend` asserts `TINKER_API_KEY` (the tinker SDK wants
one that starts with `tml-`) and imports `tinker` and `tinker_cookbook` (ART's `tinker` extra,
here the project's own `tinker` extra, which resolves apart from the dev group).

This module imports neither torch nor art at import time: the CLI must stay instant.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast, get_args
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field

from art_rlvr.backend.adapters import model_source
from art_rlvr.core.chat_template import ChatTemplateError, missing_template

if TYPE_CHECKING:
    import art

log = logging.getLogger(__name__)

BackendName = Literal["torch", "local", "serverless", "tinker"]
BACKENDS: tuple[str, ...] = get_args(BackendName)

ART_VERSION = "0.5.23"
# ART's GPU extra (unsloth, its managed vLLM runtime, torch 2.11 + CUDA 12.8) does not resolve
# together with this project's lock (it pins torch==2.11.0+cu128, which only the PyTorch index
# serves), so it lives in its own environment; README "Scaling up" explains.
GPU_INSTALL = (
    "python3 -m uv venv .venv-gpu --python 3.12 && python3 -m uv pip install --python "
    f".venv-gpu -e . 'openpipe-art[backend]=={ART_VERSION}' --torch-backend=cu128"
)
# The tinker SDK and tinker-cookbook (which pins transformers <= 5.5.4) resolve as the
# project's `tinker` extra, apart from the dev group, into an environment of their own.
TINKER_RUN = "UV_PROJECT_ENVIRONMENT=.venv-tinker uv run --locked --extra tinker --no-dev"
TINKER_INSTALL = f"{TINKER_RUN} python -m art_rlvr.run backend=tinker ..."
SKYRL_START = "python -m art_rlvr.backend.external.skyrl"
WANDB_KEY_HELP = "export WANDB_API_KEY=<your key from https://wandb.ai/authorize>"
TINKER_KEY_HELP = (
    "export TINKER_API_KEY=<your Tinker API key>; a self-hosted engine takes any, e.g. tml-local"
)
# ART's renderer for the embedded model on Tinker engines (it picks one from hub names only):
# tinker-cookbook's ChatML renderer without <think> blocks, as SmolLM2's template writes turns.
EMBEDDED_RENDERER = "qwen3_instruct"
EMBEDDED_PREFIX = "embedded:"


class BackendUnavailable(RuntimeError):
    """A backend's requirement is missing; the message is one line with the fix."""


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken parent package counts as missing
        return False


def _cuda_problem() -> str | None:
    """None when torch sees a CUDA device; else what is wrong, phrased for the error line."""
    import torch

    if torch.version.cuda is None:
        return (
            f"a CUDA build of torch (this one, {torch.__version__}, is CPU-only: "
            "install ART's GPU extra below, which brings torch+cu128)"
        )
    if not torch.cuda.is_available():
        return (
            "an NVIDIA GPU with CUDA (torch.cuda.is_available() is False here: run on a GPU "
            "machine, check nvidia-smi and CUDA_VISIBLE_DEVICES, or use backend=torch on CPU)"
        )
    return None


def missing_requirements(name: str, base_model: str | None = None) -> list[str]:
    """What `name` lacks on this machine, each phrased as `<what> (<how to get it>)`;
    `base_model`, when given, must be one that backend can load."""
    if name not in BACKENDS:
        return [f"a known backend (got {name!r}; choose one of {', '.join(BACKENDS)})"]
    missing: list[str] = []
    if name == "local":
        if (problem := _cuda_problem()) is not None:
            missing.append(problem)
        absent = [m for m in ("unsloth", "unsloth_zoo") if not _has_module(m)]
        if absent:
            missing.append(
                f"ART's GPU extra ({', '.join(absent)} not installed; install: {GPU_INSTALL}; "
                "then run with .venv-gpu/bin/python -m art_rlvr.run)"
            )
        if not os.environ.get("ART_VLLM_RUNTIME_BIN") and not (
            shutil.which("uv") or _has_module("uv")
        ):
            missing.append(
                "the `uv` executable, which ART uses to install its vLLM runtime "
                "(install: python3 -m pip install uv, or set ART_VLLM_RUNTIME_BIN)"
            )
    elif name == "serverless":
        if not os.environ.get("WANDB_API_KEY"):
            missing.append(f"WANDB_API_KEY in the environment (set: {WANDB_KEY_HELP})")
    elif name == "tinker":
        missing += tinker_problems(base_model)
    if name not in ("torch", "tinker") and base_model and base_model.startswith(EMBEDDED_PREFIX):
        missing.append(
            f"a Hugging Face base model ({base_model} runs on backend=torch only; "
            "set e.g. base_model=Qwen/Qwen2.5-0.5B-Instruct)"
        )
    return missing


def tinker_problems(base_model: str | None) -> list[str]:
    key = os.environ.get("TINKER_API_KEY")
    missing: list[str] = []
    if not key:
        missing.append(f"TINKER_API_KEY in the environment (set: {TINKER_KEY_HELP})")
    elif not key.startswith("tml-"):
        missing.append(
            f"a TINKER_API_KEY that starts with tml- (the tinker SDK refuses {key[:4]}...)"
        )
    absent = [m for m in ("tinker", "tinker_cookbook") if not _has_module(m)]
    if absent:
        missing.append(
            f"ART's tinker extra ({', '.join(absent)} not installed here; "
            f"run with: {TINKER_INSTALL})"
        )
    embedded = base_model is not None and base_model.startswith(EMBEDDED_PREFIX)
    if embedded and not os.environ.get("TINKER_BASE_URL"):
        missing.append(
            f"a self-hosted Tinker engine for {base_model}, which Tinker's service does not serve "
            f"(start one: {SKYRL_START}, then export the TINKER_BASE_URL it prints), or a hub "
            "base_model such as Qwen/Qwen3-4B-Instruct-2507"
        )
    return missing


def service_problem(name: str, base_model: str | None, timeout_s: float = 10.0) -> str | None:
    """Whether the self-hosted Tinker service a run will use answers and serves its model,
    asked once before the run starts (one request to TINKER_BASE_URL). None for the other
    backends, for Thinking Machines' own service, and when all is well."""
    url = os.environ.get("TINKER_BASE_URL")
    if name != "tinker" or not url:
        return None
    import httpx

    start = f"{SKYRL_START} --base-model {base_model} --port {urlparse(url).port or 8765}"
    try:
        answer = httpx.get(f"{url.rstrip('/')}/api/v1/get_server_capabilities", timeout=timeout_s)
        answer.raise_for_status()
        served = [m["model_name"] for m in answer.json().get("supported_models", [])]
    except httpx.HTTPError as error:
        return (
            f"no Tinker service answers at TINKER_BASE_URL={url} ({type(error).__name__}: "
            f"{error}); start the local engine ({start}), or unset TINKER_BASE_URL for "
            "the hosted Tinker service"
        )
    except (ValueError, KeyError, TypeError):
        return f"TINKER_BASE_URL={url} answers, but not as a Tinker service (no model list)"
    if base_model not in served:
        return (
            f"the Tinker service at {url} serves {', '.join(served) or 'no model'}, not "
            f"base_model={base_model}; restart it for this model ({start}), or run with "
            f"base_model={served[0] if served else '...'}"
        )
    return None


def check_requirements(name: str, base_model: str | None = None) -> None:
    """Raise `BackendUnavailable` (one line) unless `name` can start on this machine.

    Cheap: environment variables, `importlib.util.find_spec`, and for `local` a torch import
    to ask for CUDA. Nothing is started and nothing connects anywhere."""
    missing = missing_requirements(name, base_model)
    if missing:
        raise BackendUnavailable(f"backend={name} needs " + "; and ".join(missing))


# Features that only TorchBackend offers, and what happens elsewhere (logged at build time).
TORCH_ONLY_NOTES = (
    "hint reliance (expert iteration) needs per-sequence log-probabilities, which ART's public "
    "API does not offer: it is reported as n/a",
    "per-request `seed` is passed to the server but exact reproducibility of sampled rollouts "
    "(and so of resumed runs) is only guaranteed on TorchBackend",
)


class BackendChoice(BaseModel):
    """A run's backend and what it needs to know of the model: everything a run asks of the
    choice (checks before it starts, the backend, its model, a watch on a remote service)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: BackendName = "torch"
    base_model: str = model_source.DEFAULT_BASE_MODEL
    chat_template: str | None = None  # the template's text (`core.chat_template` resolves it)
    lora_rank: int = Field(default=16, ge=1)

    def check(self) -> None:
        """Everything the backend can reject before a run starts (no folder, model or
        connection yet): `check_requirements`, then a self-hosted Tinker service that does not
        answer or does not serve `base_model` (`BackendUnavailable`), then a base model without
        a chat template when the run names none (`ChatTemplateError`)."""
        check_requirements(self.name, self.base_model)
        if problem := service_problem(self.name, self.base_model):
            raise BackendUnavailable(f"backend={self.name}: {problem}")
        unset = self.chat_template is None
        if unset and model_source.declares_chat_template(self.base_model) is False:
            raise ChatTemplateError(missing_template(self.base_model))

    def base_model_problem(self) -> str | None:
        """Why the base model cannot load on this machine, found without loading it; None on
        serverless and tinker, which load it remotely."""
        loads_here = self.name in ("torch", "local")
        return model_source.base_model_problem(self.base_model) if loads_here else None

    def internal_config(self) -> dict[str, object] | None:
        """ART's `_internal_config` entries the backend needs from the run: on tinker, the
        run's LoRA rank (ART's native default is 1) and, for the embedded model, its renderer."""
        if self.name != "tinker":
            return None
        args: dict[str, object] = {"training_client_args": {"rank": self.lora_rank}}
        if self.base_model.startswith(EMBEDDED_PREFIX):
            args["renderer_name"] = EMBEDDED_RENDERER
        return {"tinker_native_args": args}

    def trainable_model(self, name: str, project: str) -> art.TrainableModel:
        """The run's `art.TrainableModel` (run_name = name). The chat template travels in ART's
        own `_internal_config`, which ART's backends and TorchBackend both read, to serve and
        train, beside the backend's own entries (`internal_config`)."""
        import art
        from art.dev.model import InternalModelConfig

        entries = {
            **(self.internal_config() or {}),
            **({} if self.chat_template is None else {"chat_template": self.chat_template}),
        }
        config = cast(InternalModelConfig, entries) if entries else None
        return art.TrainableModel(
            name=name,
            project=project,
            run_name=name,
            base_model=self.base_model,
            _internal_config=config,
        )

    def build(self, *, path: str | Path, seed: int = 0, **torch_options: Any) -> Any:
        """An `art.Backend`, built through ART's public constructors after `check_requirements`.

        `path` is the ART folder (checkpoints, logs) for the torch, local and tinker backends;
        ServerlessBackend keeps its state on W&B. `lora_rank` and `torch_options` configure
        TorchBackend; ART's backends take the LoRA settings from the model's `_internal_config`."""
        name, base_model, lora_rank = self.name, self.base_model, self.lora_rank
        check_requirements(name, base_model)
        if name == "torch":
            from art_rlvr.backend.torch_backend import LoraSettings, TorchBackend

            return TorchBackend(
                path=path,
                seed=seed,
                lora=LoraSettings(rank=lora_rank, alpha=2 * lora_rank),
                **torch_options,
            )
        lora = (
            f"lora_rank={lora_rank} is the Tinker training client's rank"
            if name == "tinker"
            else f"lora_rank={lora_rank} is ignored (ART's defaults apply)"
        )
        for note in (*TORCH_ONLY_NOTES, lora):
            log.info("backend=%s: %s", name, note)
        if name == "local":
            from art.local import LocalBackend

            return LocalBackend(path=str(path))
        if name == "serverless":
            from art.serverless import ServerlessBackend

            return ServerlessBackend()
        from art_rlvr.backend.external.tinker import TinkerBackend, register_embedded_tokenizer

        if base_model.startswith(EMBEDDED_PREFIX):
            register_embedded_tokenizer(base_model)
        log.info(
            "backend=tinker: service %s; sampling is the engine's (runs are not bit-reproducible)",
            os.environ.get("TINKER_BASE_URL") or "Thinking Machines' Tinker",
        )
        return TinkerBackend(path=str(path))

    async def service_lost(self, *, every_s: float = 5.0, patience_s: float = 45.0) -> str:
        """Wait until the self-hosted Tinker service stops answering for `patience_s`, and say
        so in one line. The tinker SDK retries a dead service for as long as its session lives,
        so without this a run whose engine died would hang instead of stopping to be resumed."""
        import httpx

        url = os.environ["TINKER_BASE_URL"].rstrip("/")
        start = f"{SKYRL_START} --base-model {self.base_model} --port {urlparse(url).port or 8765}"
        last_answer = time.monotonic()
        async with httpx.AsyncClient(timeout=every_s) as client:
            while True:
                try:
                    (await client.get(f"{url}/api/v1/healthz")).raise_for_status()
                    last_answer = time.monotonic()
                except httpx.HTTPError as error:
                    silent = time.monotonic() - last_answer
                    if silent >= patience_s:
                        return (
                            f"the Tinker service at {url} stopped answering {silent:.0f} s ago "
                            f"({type(error).__name__}); restart it ({start}) and re-run the same "
                            "command to resume"
                        )
                await asyncio.sleep(every_s)
