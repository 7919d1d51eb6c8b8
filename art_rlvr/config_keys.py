"""Command-line keys of a run: old names, LLM roles, secrets, and errors phrased as one line.

Kept apart from `config` (the run's settings) so that module stays about the settings.
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

from pydantic import ValidationError

from art_rlvr.llm_settings import LLMRole
from art_rlvr.text import did_you_mean

# a key name that holds a secret: api_key, password, auth_token; not max_tokens, not *_key_env
# (the name of an environment variable, which is what a reader needs to see)
SECRET_NAME = re.compile(r"(key|secret|password|token)$", re.IGNORECASE)


# one name per concept; the old names still work and warn
RUN_RENAMED = {"n_rounds": "rounds"}
SUB_RENAMED = {"rollouts_per_problem": "group_size", "expert_samples_per_x": "group_size"}
# an LLM role's keys on the command line: `reflection.model=...` (GEPA), `teacher.model=...` (EI)
ROLES = {"reflection": "gepa", "teacher": "ei"}


class ConfigError(ValueError):
    """A bad run configuration, phrased for the command line."""


def mask_secrets(data: Any) -> Any:
    """`***` for every non-empty value whose key names a secret, at any depth."""
    if isinstance(data, dict):
        return {
            k: "***" if SECRET_NAME.search(str(k)) and v else mask_secrets(v)
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [mask_secrets(v) for v in data]
    return data


def coerce_source_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return [part.strip() for part in raw.split(",")] if "," in raw else raw


def first_error(error: ValidationError, values: dict[str, Any], prefix: str = "") -> ConfigError:
    first = error.errors()[0]
    if not first["loc"]:  # a check across keys (model_validator): its message says it all
        return ConfigError(first["msg"].removeprefix("Value error, "))
    key = ".".join(str(p) for p in first["loc"]) or "config"
    raw = values.get(str(first["loc"][0]))
    given = repr(raw) if len(repr(raw)) <= 60 else f"{repr(raw)[:57]}..."  # a long prompt
    message = first["msg"].removeprefix("Value error, ")
    if message.startswith(f"{key}:") or message.startswith(f"{key}="):  # it names the key itself
        return ConfigError(message)
    if first["type"] == "literal_error":  # one of a few names: the closest, then all of them
        choices = re.findall(r"'([^']*)'", first["ctx"]["expected"])
        hint = did_you_mean(str(raw), choices)
        return ConfigError(
            f"bad value for {prefix}{key!r}: {given}{hint}; one of {', '.join(choices)}"
        )
    allowed = first.get("ctx", {}).get("expected")
    extra = f" (expected {allowed})" if allowed and str(allowed) not in message else ""
    return ConfigError(f"bad value for {prefix}{key!r}: {given}: {message}{extra}")


def canonical(key: str) -> str:
    """The current name of a key given under an old one (warned once per use)."""
    prefix, dot, field = key.partition("_")
    if prefix in ROLES and dot and field in LLMRole.model_fields:
        new = f"{prefix}.{field}"
    else:
        new = RUN_RENAMED.get(key) or SUB_RENAMED.get(key) or key
    if new != key:
        warnings.warn(f"{key} is deprecated, use {new}", FutureWarning, stacklevel=3)
    return new
