"""Which ART backend runs a run: `backend=torch|local|serverless|tinker`.

`check_requirements(name)` runs before anything heavy starts (no model load, no server, no
connection): a missing requirement is a `BackendUnavailable` with one line naming what is
missing and the command that installs or sets it. `build_backend(name, ...)` then constructs
the backend through ART's public constructors:

- `torch`: art_rlvr's `TorchBackend` (embedded model, CPU or one CUDA GPU, no key);
- `local`: `art.local.LocalBackend` (unsloth training + ART's managed vLLM runtime on this
  machine's NVIDIA GPUs);
- `serverless`: `art.serverless.ServerlessBackend` (W&B Training; `WANDB_API_KEY`);
- `tinker`: `art.tinker.TinkerBackend` (Thinking Machines' Tinker; `TINKER_API_KEY`).

Requirements were read from openpipe-art 0.5.23: `LocalBackend` imports torch at module level
and unsloth when its training service starts, and installs its vLLM runtime with the `uv`
executable on first use (or takes `ART_VLLM_RUNTIME_BIN`); `ServerlessBackend`'s client raises
without `WANDB_API_KEY`; `TinkerBackend` asserts `TINKER_API_KEY` and its service imports
`tinker` and `tinker_cookbook` (ART's `tinker` extra).

This module imports neither torch nor art at import time: the CLI must stay instant.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Literal, get_args

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
TINKER_INSTALL = (
    "python3 -m uv venv .venv-tinker --python 3.12 && python3 -m uv pip install --python "
    f".venv-tinker -e . 'openpipe-art[tinker]=={ART_VERSION}'"
)
WANDB_KEY_HELP = "export WANDB_API_KEY=<your key from https://wandb.ai/authorize>"
TINKER_KEY_HELP = "export TINKER_API_KEY=<your Tinker API key>"
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
        if not os.environ.get("TINKER_API_KEY"):
            missing.append(f"TINKER_API_KEY in the environment (set: {TINKER_KEY_HELP})")
        absent = [m for m in ("tinker", "tinker_cookbook") if not _has_module(m)]
        if absent:
            missing.append(
                f"ART's tinker extra ({', '.join(absent)} not installed; "
                f"install: {TINKER_INSTALL}; then run with .venv-tinker/bin/python -m art_rlvr.run)"
            )
    if name != "torch" and base_model is not None and base_model.startswith(EMBEDDED_PREFIX):
        missing.append(
            f"a Hugging Face base model ({base_model} runs on backend=torch only; "
            "set e.g. base_model=Qwen/Qwen2.5-0.5B-Instruct)"
        )
    return missing


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


def build_backend(
    name: str,
    *,
    path: str | Path,
    seed: int = 0,
    lora_rank: int = 16,
    base_model: str | None = None,
    **torch_options: Any,
) -> Any:
    """An `art.Backend` for `name`, built through ART's public constructors, after
    `check_requirements(name, base_model)`.

    `path` is the ART folder (checkpoints, logs) for the torch, local and tinker backends;
    ServerlessBackend keeps its state on W&B. `lora_rank` and `torch_options` configure
    TorchBackend; ART's backends take the LoRA settings from the model's `_internal_config`."""
    check_requirements(name, base_model)
    if name == "torch":
        from art_rlvr.backend.torch_backend import LoraSettings, TorchBackend

        return TorchBackend(
            path=path,
            seed=seed,
            lora=LoraSettings(rank=lora_rank, alpha=2 * lora_rank),
            **torch_options,
        )
    for note in (*TORCH_ONLY_NOTES, f"lora_rank={lora_rank} is ignored (ART's defaults apply)"):
        log.info("backend=%s: %s", name, note)
    if name == "local":
        from art.local import LocalBackend

        return LocalBackend(path=str(path))
    if name == "serverless":
        from art.serverless import ServerlessBackend

        return ServerlessBackend()
    from art.tinker import TinkerBackend

    return TinkerBackend(path=str(path))
