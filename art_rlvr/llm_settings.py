"""Where and how to call a chat model: the settings of one call site and of one LLM role.

Pure data (pydantic, no litellm), so the CLI can validate keys without importing the client.
"""

from __future__ import annotations

import warnings
from typing import Any, TypedDict

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


class CallSettings(TypedDict):
    """How patiently to call a model and how to sample: `LLMSettings`'s fields besides where."""

    timeout_s: float
    max_retries: int
    backoff_initial_s: float
    backoff_max_s: float
    temperature: float
    max_tokens: int


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

    def overrides(self) -> CallSettings:
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


def renamed(data: Any, old_to_new: dict[str, str], owner: str) -> Any:
    """Accept old key names as aliases of the new ones, with a FutureWarning naming the new."""
    if not isinstance(data, dict) or not old_to_new.keys() & data.keys():
        return data
    out = dict(data)
    for old, new in old_to_new.items():
        if old in out:
            warnings.warn(f"{owner}: {old} is deprecated, use {new}", FutureWarning, stacklevel=4)
            out.setdefault(new, out.pop(old))
    return out


def flat_role_aliases(
    data: Any, role: str, owner: str, defaults: dict[str, Any] | None = None
) -> Any:
    """Map the old flat keys (`reflection_model`, `teacher_timeout_s`, ...) into the nested role
    (`reflection.model`, ...) with a FutureWarning naming the new key; a role given as a dict
    is laid over the owner's `defaults` for it."""
    if not isinstance(data, dict):
        return data
    flat = {f"{role}_{f}": f for f in LLMRole.model_fields if f"{role}_{f}" in data}
    nested = data.get(role)
    if not flat and not isinstance(nested, dict):
        return data
    merged = {**(defaults or {}), **(nested if isinstance(nested, dict) else {})}
    if isinstance(nested, LLMRole):
        merged = nested.model_dump(exclude_unset=True)
    for key, name in flat.items():
        warnings.warn(
            f"{owner}: {key} is deprecated, use {role}.{name}", FutureWarning, stacklevel=4
        )
        merged[name] = data[key]
    return {**{k: v for k, v in data.items() if k not in flat}, role: merged}
