"""Command-line keys of a run: LLM roles, secrets, and errors phrased as one line.

Kept apart from `config` (the run's settings) so that module stays about the settings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from pydantic import JsonValue, ValidationError

from art_rlvr.core.text import did_you_mean

# a key name that holds a secret: api_key, password, auth_token; not max_tokens, not *_key_env
# (the name of an environment variable, which is what a reader needs to see)
SECRET_NAME = re.compile(r"(key|secret|password|token)$", re.IGNORECASE)


class ConfigError(ValueError):
    """A bad run configuration, phrased for the command line."""


def mask_secrets(data: JsonValue) -> JsonValue:
    """`***` for every non-empty value whose key names a secret, at any depth."""
    if isinstance(data, dict):
        return {
            k: "***" if SECRET_NAME.search(str(k)) and v else mask_secrets(v)
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [mask_secrets(v) for v in data]
    return data


def coerce_source_value(raw: str) -> JsonValue:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return [part.strip() for part in raw.split(",")] if "," in raw else raw


def first_error(
    error: ValidationError, values: Mapping[str, object], prefix: str = ""
) -> ConfigError:
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
