"""An external policy for `mode=eval`: any litellm model string or an OpenAI-compatible base URL.

With a base URL the policy is ART's own `art.Model(inference_base_url=...)`, so
`art_rlvr.rollouts.rollout` runs unchanged. A provider string without one (`anthropic/...`,
`gemini/...`, `openai/gpt-4o-mini`) goes through `LiteLLMPolicy`: the two calls rollout makes
(`openai_client().chat.completions.create`, `get_inference_name`) over `litellm.acompletion`,
answering with openai `ChatCompletion` objects, and counting tokens and litellm's cost.

The key is read from the environment when the policy is built and held in memory only; the
config names the variable, never the value.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from art_rlvr.llm.settings import Endpoint

if TYPE_CHECKING:
    import art
    from openai.types.chat import ChatCompletion


class PolicyError(ValueError):
    """An external policy that cannot be called (a missing key variable, ...): one line."""


class PolicyRole(Endpoint):
    """`policy.*` on the command line: which external model `mode=eval` scores (the endpoint
    every LLM role has, and how many requests it may have open)."""

    model: str | None = Field(
        default=None,
        description="mode=eval: a litellm model string (openai/gpt-4o-mini, anthropic/...) "
        "to evaluate instead of the embedded model; none: the run's own model",
    )
    max_in_flight: int = Field(default=8, ge=1, description="requests open at once")

    @model_validator(mode="after")
    def _base_needs_model(self) -> PolicyRole:
        if (self.api_base or self.api_key_env) and not self.model:
            raise ValueError("api_base / api_key_env need policy.model (e.g. 'openai/<name>')")
        return self

    @property
    def label(self) -> str:
        return self.model or "embedded"


def read_key(role: PolicyRole) -> str | None:
    """The key from the variable `api_key_env` names (None: litellm's usual variables, or a
    local server that needs none); a named variable that is unset is an error, before any
    request is made."""
    if role.api_key_env is None:
        if role.api_base is None and role.model is not None:
            missing_provider_keys(role.model)
        return None
    value = os.environ.get(role.api_key_env)
    if not value:
        raise PolicyError(f"policy.api_key_env: environment variable {role.api_key_env} is not set")
    return value


def missing_provider_keys(model: str) -> None:
    """litellm's own check of the provider's key variables (OPENAI_API_KEY, ...)."""
    import litellm

    missing = litellm.validate_environment(model=model).get("missing_keys") or []
    if missing:
        raise PolicyError(
            f"policy.model={model} needs {', '.join(missing)} in the environment "
            "(or name another variable with policy.api_key_env)"
        )


def served_name(model: str) -> str:
    """`openai/<name>` -> `<name>`: the name an OpenAI-compatible server knows."""
    provider, slash, name = model.partition("/")
    return name if slash and provider == "openai" else model


@dataclass
class Usage:
    """What the litellm path spent; `cost_usd` is None once any reply had no known price."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0

    def add(self, response: object, cost: float | None) -> None:
        usage = getattr(response, "usage", None)
        self.requests += 1
        self.prompt_tokens += int(getattr(usage, "prompt_tokens", 0) or 0)
        self.completion_tokens += int(getattr(usage, "completion_tokens", 0) or 0)
        self.cost_usd = None if self.cost_usd is None or cost is None else self.cost_usd + cost


def litellm_cost(response: object) -> float | None:
    """litellm's price of one reply, or None where it does not know the model's."""
    import litellm

    try:
        cost = litellm.completion_cost(completion_response=response)
    except Exception:  # litellm raises for a model missing from its price map
        return None
    return float(cost) if isinstance(cost, int | float) and math.isfinite(cost) else None


@dataclass
class _Completions:
    policy: LiteLLMPolicy

    async def create(self, *, model: str, **kwargs: Any) -> ChatCompletion:
        import litellm
        from openai.types.chat import ChatCompletion  # here: the CLI parses keys without openai

        p = self.policy
        response = await litellm.acompletion(
            model=model,
            api_key=p.api_key,
            timeout=p.role.timeout_s,
            num_retries=p.role.max_retries,
            drop_params=True,  # logprobs / seed where the provider has none
            **kwargs,
        )
        p.usage.add(response, litellm_cost(response))
        return ChatCompletion.model_validate(response.model_dump())


@dataclass
class _Chat:
    completions: _Completions


@dataclass
class _Client:
    chat: _Chat


@dataclass
class LiteLLMPolicy:
    """The surface `rollout` calls, over `litellm.acompletion`; a provider that litellm
    speaks but that is no OpenAI-compatible server (anthropic/, gemini/, ...) is evaluated
    with the same rollout code."""

    role: PolicyRole
    api_key: str | None
    usage: Usage = field(default_factory=Usage)

    @property
    def name(self) -> str:
        return self.role.label

    def openai_client(self) -> _Client:
        return _Client(_Chat(_Completions(self)))

    def get_inference_name(self, step: int | None = None) -> str:
        return self.role.label


def external_model(role: PolicyRole, *, project: str) -> art.Model | LiteLLMPolicy:
    """The policy to roll out: ART's `art.Model` for a base URL, else litellm's adapter."""
    import art  # here, not at the top: the config imports this module and must stay light

    if role.model is None:
        raise PolicyError("no external policy: set policy.model")
    key = read_key(role)
    if role.api_base is None:
        return LiteLLMPolicy(role, key)
    return art.Model(
        name=served_name(role.model).replace("/", "-"),
        project=project,
        inference_base_url=role.api_base,
        inference_api_key=key or "none",  # a local server may want no key; the SDK wants one
        inference_model_name=served_name(role.model),
    )


def spent(model: object) -> Usage | None:
    """The litellm path's usage (None for ART's client, which reports no prices)."""
    return model.usage if isinstance(model, LiteLLMPolicy) else None


__all__ = [
    "LiteLLMPolicy",
    "PolicyError",
    "PolicyRole",
    "Usage",
    "external_model",
    "litellm_cost",
    "read_key",
    "served_name",
    "spent",
]
