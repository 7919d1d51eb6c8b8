"""Test helpers that run for real on loopback: a scripted OpenAI-compatible server."""

from art_rlvr.testing.scripted_server import (
    Recorded,
    ScriptedServer,
    Step,
    completion_payload,
    scripted_model,
)

__all__ = ["Recorded", "ScriptedServer", "Step", "completion_payload", "scripted_model"]
