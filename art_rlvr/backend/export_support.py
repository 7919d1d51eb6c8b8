"""What `python -m art_rlvr.serve` needs from TorchBackend beyond ART's protocol.

The backend's own server listens on a free port it picks; serving a finished run for other
tools wants a port the user chooses. This hands out the same FastAPI app (same routes, same
request checks, same `name@step` routing) so the caller can bind it where it likes.
"""

from __future__ import annotations

from fastapi import FastAPI

from art_rlvr.backend.server import build_app
from art_rlvr.backend.torch_backend import TorchBackend


def serving_app(backend: TorchBackend, api_key: str) -> FastAPI:
    """TorchBackend's OpenAI-compatible app over the models registered with `backend`."""
    return build_app(
        resolve=backend._resolve,
        list_models=backend._served_names,
        api_key=api_key,
        default_max_tokens=backend.default_max_tokens,
    )
