"""Where and how to call a chat model: the settings of one call site and of one LLM role.

Pure data (pydantic, no litellm), so the CLI can validate keys without importing the client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Endpoint(BaseModel):
    """Where a chat model answers and how patiently to call it: the one shape of every model a
    run talks to (GEPA's reflector, expert iteration's teacher, `mode=eval`'s policy).
    `model=None` means the run's own model. Holds no secret, only the name of the environment
    variable with the key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str | None = Field(
        default=None,
        description="a litellm model string (e.g. openai/gpt-4.1-mini); none: the embedded model",
    )
    api_base: str | None = Field(
        default=None, description="an OpenAI-compatible base URL (with model='openai/<name>')"
    )
    api_key_env: str | None = Field(
        default=None, description="the environment variable that holds the key"
    )
    timeout_s: float = Field(default=120.0, gt=0, description="seconds per request")
    max_retries: int = Field(
        default=4, ge=0, le=20, description="retries of 429 / 5xx / timeouts / resets"
    )

    @model_validator(mode="after")
    def _base_needs_model(self) -> Endpoint:
        if self.api_base and not self.model:
            raise ValueError("api_base needs model (e.g. 'openai/<name>')")
        return self


class LLMRole(Endpoint):
    """An LLM role of a run (GEPA's reflector, expert iteration's teacher): an endpoint and how
    to sample from it. With `model` set it is also what `LLMClient` calls."""

    backoff_s: float = Field(default=1.0, ge=0, description="first retry's wait, doubling")
    backoff_max_s: float = Field(default=60.0, ge=0, description="cap on one wait")
    temperature: float = Field(default=0.7, ge=0.0, le=2.0, description="sampling temperature")
    max_tokens: int = Field(default=1024, ge=8, description="reply length cap")

    def embedded(self, model: str, api_base: str, timeout_s: float) -> LLMRole:
        """The same role pointed at the run's own model (its served name and endpoint)."""
        return self.model_copy(
            update={"model": model, "api_base": api_base, "timeout_s": timeout_s}
        )


# keys renamed in 0.1: refused with the one name now, never aliased
RENAMED = {
    "n_rounds": "rounds",
    "rollouts_per_problem": "group_size",
    "expert_samples_per_x": "group_size",
}
# an LLM role's keys on the command line: `reflection.model=...` (GEPA), `teacher.model=...` (EI)
ROLES = {"reflection": "gepa", "teacher": "ei"}


def renamed_to(key: str) -> str | None:
    """The current name of a renamed key (`reflection_model` is `reflection.model`), or None."""
    prefix, _, field = key.partition("_")
    if prefix in ROLES and field in LLMRole.model_fields:
        return f"{prefix}.{field}"
    return RENAMED.get(key)


def refuse_renamed(data: object, owner: str) -> None:
    """A settings dict that uses an old key name is an error naming the new one."""
    if isinstance(data, dict):
        for key in data:
            if (new := renamed_to(str(key))) is not None:
                raise ValueError(f"{owner}: {key} was renamed {new}")


def role_over_defaults(data: Any, role: str, defaults: Mapping[str, object]) -> Any:
    """A role given as a dict, laid over the owner's defaults for it (`teacher.model=...`
    keeps the teacher's own `max_tokens`)."""
    if not isinstance(data, dict) or not isinstance(data.get(role), dict):
        return data
    return {**data, role: {**defaults, **data[role]}}
