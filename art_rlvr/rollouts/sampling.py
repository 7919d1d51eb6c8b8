"""How a rollout samples, and the seeds that make a rollout reproducible: shared by the
single-reply `rollout` and the episode loop underneath it."""

from __future__ import annotations

import hashlib
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# The sampling knobs a run and its phases share (`RunConfig`, `GEPAConfig`, `EIConfig`), each
# bounded once here; a phase may give one another default, and the run shows where it does.
MaxTokens = Annotated[int, Field(ge=1, le=4096)]
Temperature = Annotated[float, Field(ge=0.0, le=5.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
GroupSize = Annotated[int, Field(ge=1)]
SHARED_KNOBS = ("group_size", "max_tokens", "temperature", "top_p", "seed")


class SamplingConfig(BaseModel):
    """How a rollout samples; `seed` makes a rollout's sample reproducible on TorchBackend."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(default=48, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # overrides the scenario's tool_choice for these rollouts (expert iteration's search may
    # force a named call that its distilled episodes then train without)
    tool_choice: str | None = None


def rollout_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts (run seed, step, scenario id, sample index)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


__all__ = [
    "SHARED_KNOBS",
    "GroupSize",
    "MaxTokens",
    "SamplingConfig",
    "Temperature",
    "TopP",
    "rollout_seed",
]
