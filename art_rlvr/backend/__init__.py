"""The backend: TorchBackend (an ART backend that samples and trains in-process) and the choice
among ART's backends. This is its public API, seven names:

- `TorchBackend` and its `LoraSettings` (`serve_on` serves it on a socket of the caller's);
- `BackendChoice`: a run's `backend=` with its base model, chat template and LoRA rank, which
  checks what it can before the run, builds the backend, makes the model, watches a remote
  service; `BackendName`, its choices; `BackendUnavailable`, the one-line error it raises;
- `DEFAULT_BASE_MODEL` and `resolve_base_model`: the embedded model, and any base model as a
  folder or hub id that transformers loads (export loads the run's base weights so).

What is not one backend's lives below it, in `art_rlvr.core`: what `chat_template=` means
(`chat_template.py`) and ART's checkpoint folders (`art_layout.py`).

The subpackages are internal and, outside this package, are imported only by tests and
benchmarks:

- `chat/`: chat rendering and tool-call parsing, a model's chat template on the tokenizer;
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
    from art_rlvr.backend.adapters.model_source import DEFAULT_BASE_MODEL as DEFAULT_BASE_MODEL
    from art_rlvr.backend.adapters.model_source import resolve_base_model as resolve_base_model
    from art_rlvr.backend.adapters.registry import LoraSettings as LoraSettings
    from art_rlvr.backend.choose import BackendChoice as BackendChoice
    from art_rlvr.backend.choose import BackendName as BackendName
    from art_rlvr.backend.choose import BackendUnavailable as BackendUnavailable
    from art_rlvr.backend.torch_backend import TorchBackend as TorchBackend

_EXPORTS = {
    "TorchBackend": "art_rlvr.backend.torch_backend",
    "LoraSettings": "art_rlvr.backend.adapters.registry",
    "BackendChoice": "art_rlvr.backend.choose",
    "BackendName": "art_rlvr.backend.choose",
    "BackendUnavailable": "art_rlvr.backend.choose",
    "DEFAULT_BASE_MODEL": "art_rlvr.backend.adapters.model_source",
    "resolve_base_model": "art_rlvr.backend.adapters.model_source",
}

__all__, __getattr__, __dir__ = lazy_exports("art_rlvr.backend", _EXPORTS)
