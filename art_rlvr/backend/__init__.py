"""The backend: TorchBackend (an ART backend that samples and trains in-process) and the choice
among ART's backends. This is its public API; the subpackages below are internal and, outside
this package, are imported only by tests and benchmarks:

- `chat/`: chat rendering and tool-call parsing, chat templates;
- `engine/`: the generation engine (continuous batching, batch invariance, sampling, grammars);
- `serving/`: the OpenAI-compatible server over the engine and the log of what it served;
- `adapters/`: LoRA adapters per model and step, checkpoints, the base model's source;
- `training/`: token data, losses and optimizer steps;
- `runtime/`: threads, OpenMP spinning and malloc tuned for CPU work;
- `external/`: engines past TorchBackend (ART's Tinker backend, a local SkyRL engine);
- `torch_backend.py` (TorchBackend) and `choose.py` (`backend=torch|local|serverless|tinker`).

Names resolve lazily: the config imports some, and must not import torch or ART to do so.
"""

from typing import TYPE_CHECKING

from art_rlvr.core.lazy import lazy_exports

if TYPE_CHECKING:  # the same names, for type checkers
    from art_rlvr.backend.adapters.checkpoints import checkpoint_dir as checkpoint_dir
    from art_rlvr.backend.adapters.checkpoints import list_steps as list_steps
    from art_rlvr.backend.adapters.model_source import DEFAULT_BASE_MODEL as DEFAULT_BASE_MODEL
    from art_rlvr.backend.adapters.model_source import base_model_problem as base_model_problem
    from art_rlvr.backend.adapters.model_source import resolve_base_model as resolve_base_model
    from art_rlvr.backend.adapters.registry import LoraSettings as LoraSettings
    from art_rlvr.backend.chat.templates import ChatTemplateError as ChatTemplateError
    from art_rlvr.backend.chat.templates import resolve_chat_template as resolve_chat_template
    from art_rlvr.backend.chat.templates import trainable_model as trainable_model
    from art_rlvr.backend.choose import BackendName as BackendName
    from art_rlvr.backend.choose import BackendUnavailable as BackendUnavailable
    from art_rlvr.backend.choose import build_backend as build_backend
    from art_rlvr.backend.choose import check_backend as check_backend
    from art_rlvr.backend.choose import check_requirements as check_requirements
    from art_rlvr.backend.choose import model_config as model_config
    from art_rlvr.backend.choose import service_lost as service_lost
    from art_rlvr.backend.serving.server import new_api_key as new_api_key
    from art_rlvr.backend.torch_backend import TorchBackend as TorchBackend
    from art_rlvr.backend.torch_backend import serve_backend as serve_backend

_EXPORTS = {
    # TorchBackend
    "TorchBackend": "art_rlvr.backend.torch_backend",
    "LoraSettings": "art_rlvr.backend.adapters.registry",
    "serve_backend": "art_rlvr.backend.torch_backend",
    "new_api_key": "art_rlvr.backend.serving.server",
    # choosing a backend, and what it checks before a run starts
    "BackendName": "art_rlvr.backend.choose",
    "BackendUnavailable": "art_rlvr.backend.choose",
    "build_backend": "art_rlvr.backend.choose",
    "check_backend": "art_rlvr.backend.choose",
    "check_requirements": "art_rlvr.backend.choose",
    "model_config": "art_rlvr.backend.choose",
    "service_lost": "art_rlvr.backend.choose",
    # the base model and its chat template
    "DEFAULT_BASE_MODEL": "art_rlvr.backend.adapters.model_source",
    "base_model_problem": "art_rlvr.backend.adapters.model_source",
    "resolve_base_model": "art_rlvr.backend.adapters.model_source",
    "ChatTemplateError": "art_rlvr.backend.chat.templates",
    "resolve_chat_template": "art_rlvr.backend.chat.templates",
    "trainable_model": "art_rlvr.backend.chat.templates",
    # checkpoints in ART's layout
    "checkpoint_dir": "art_rlvr.backend.adapters.checkpoints",
    "list_steps": "art_rlvr.backend.adapters.checkpoints",
}

__all__, __getattr__, __dir__ = lazy_exports("art_rlvr.backend", _EXPORTS)
