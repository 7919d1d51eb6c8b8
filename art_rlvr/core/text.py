"""Small pure text helpers shared by every layer: stable hashes and one-line excerpts."""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Iterable


def prompt_hash(system_prompt: str) -> str:
    """A short stable id for a system prompt (records, traces and GEPA's cache key on it)."""
    return hashlib.sha256(system_prompt.encode()).hexdigest()[:12]


def fingerprint(*parts: object) -> str:
    """A stable 16-hex digest of JSON-able parts: a run refuses to resume under other settings."""
    blob = json.dumps(list(parts), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def excerpt(text: str, limit: int = 160) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis (for log lines)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest of `choices`, or '' when none is close: every
    "unknown name" error says it the same way."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def first_line(error: BaseException) -> str:
    """An exception as one line (library errors can run to pages)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
