"""Where and how to call a chat model: the settings of one call site and of one LLM role.

Pure data (pydantic, no litellm), so the CLI can validate keys without importing the client.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class LLMSettings(BaseModel):
    """Where and how to call a chat model. No secret lives here: only the name of the
    environment variable that holds one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1)
    api_base: str | None = None
    api_key_env: str | None = None
    timeout_s: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=4, ge=0, le=20)
    backoff_initial_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=60.0, ge=0)
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    max_tokens: int = Field(default=1024, ge=1)


class LLMRole(BaseModel):
    """One LLM role of a run (GEPA's reflector, expert iteration's teacher): which model, where,
    and how patiently to call it. `model=None` means the embedded model through its own
    endpoint. Holds no secret, only the name of the environment variable with the key."""

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
    backoff_s: float = Field(default=1.0, ge=0, description="first retry's wait, doubling")
    backoff_max_s: float = Field(default=60.0, ge=0, description="cap on one wait")
    temperature: float = Field(default=0.7, ge=0.0, le=2.0, description="sampling temperature")
    max_tokens: int = Field(default=1024, ge=8, description="reply length cap")

    @model_validator(mode="after")
    def _base_needs_model(self) -> LLMRole:
        if self.api_base and not self.model:
            raise ValueError("api_base needs model (e.g. 'openai/<name>')")
        return self

    def overrides(self) -> dict[str, float | int]:
        """The call settings, for the embedded model's client too."""
        return {
            "timeout_s": self.timeout_s,
            "max_retries": self.max_retries,
            "backoff_initial_s": self.backoff_s,
            "backoff_max_s": self.backoff_max_s,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }

    def settings(self) -> LLMSettings | None:
        """The external model's settings, or None for the embedded model."""
        if self.model is None:
            return None
        return LLMSettings(
            model=self.model,
            api_base=self.api_base,
            api_key_env=self.api_key_env,
            **self.overrides(),
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


def refuse_renamed(data: Any, owner: str) -> None:
    """A settings dict that uses an old key name is an error naming the new one."""
    if isinstance(data, dict):
        for key in data:
            if (new := renamed_to(str(key))) is not None:
                raise ValueError(f"{owner}: {key} was renamed {new}")


def role_over_defaults(data: Any, role: str, defaults: dict[str, Any]) -> Any:
    """A role given as a dict, laid over the owner's defaults for it (`teacher.model=...`
    keeps the teacher's own `max_tokens`)."""
    if not isinstance(data, dict) or not isinstance(data.get(role), dict):
        return data
    return {**data, role: {**defaults, **data[role]}}
