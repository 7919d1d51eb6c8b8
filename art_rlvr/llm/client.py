"""A small litellm-backed chat client for reflection (GEPA) and teachers.

Every litellm model string works: `openai/gpt-4.1-mini`, `anthropic/claude-...`, or
`openai/<name>` with `api_base` for an OpenAI-compatible server (our own TorchBackend included).
Keys come from the environment (litellm's usual variables, or the one named by `api_key_env`)
or are handed in by the caller; they are held in memory only, never logged, never written.

Failures are never swallowed: 429 (honouring Retry-After), 5xx, timeouts and connection errors
are retried with exponential backoff; anything else, or a retryable error that outlives its
retries, raises `LLMError`. Every attempt and every error is counted in `LLMCounters`, which a
caller can log or put in a summary.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from art_rlvr.llm.settings import LLMRole
from art_rlvr.observe import tracing

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm must not fetch at import

log = logging.getLogger(__name__)

ErrorKind = Literal[
    "rate_limited", "server_error", "timeout", "connection", "empty_reply", "auth", "bad_request"
]
RETRYABLE: frozenset[str] = frozenset({"rate_limited", "server_error", "timeout", "connection"})
FATAL: frozenset[str] = frozenset({"auth"})


class LLMReply(BaseModel):
    model_config = ConfigDict(frozen=True)

    text: str
    finish_reason: str | None
    attempts: int
    seconds: float
    prompt_tokens: int = 0
    completion_tokens: int = 0


class LLMError(RuntimeError):
    """A call that failed for good; `kind` says why, `attempts` how hard we tried."""

    def __init__(
        self, message: str, *, kind: ErrorKind, status: int | None = None, attempts: int = 1
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.attempts = attempts

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE

    @property
    def fatal(self) -> bool:
        """Configuration errors (bad key): retrying later in the run cannot help."""
        return self.kind in FATAL


@dataclass
class LLMCounters:
    """Thread-safe tallies of what the client did; `snapshot()` is JSON-able."""

    calls: int = 0
    succeeded: int = 0
    failed: int = 0
    attempts: int = 0
    retries: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    slept_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def restore(cls, snapshot: Mapping[str, Any]) -> LLMCounters:  # JSON from run state
        """Counters as a `snapshot()` left them (a resumed run keeps counting from there)."""
        return cls(
            calls=int(snapshot.get("calls", 0)),
            succeeded=int(snapshot.get("succeeded", 0)),
            failed=int(snapshot.get("failed", 0)),
            attempts=int(snapshot.get("attempts", 0)),
            retries=int(snapshot.get("retries", 0)),
            errors={str(k): int(v) for k, v in dict(snapshot.get("errors", {})).items()},
            slept_s=float(snapshot.get("slept_s", 0.0)),
        )

    def add(self, **deltas: float) -> None:
        with self._lock:
            for key, value in deltas.items():
                setattr(self, key, getattr(self, key) + value)

    def error(self, kind: str) -> None:
        with self._lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {
                "calls": self.calls,
                "succeeded": self.succeeded,
                "failed": self.failed,
                "attempts": self.attempts,
                "retries": self.retries,
                "errors": dict(sorted(self.errors.items())),
                "error_total": sum(self.errors.values()),
                "slept_s": round(self.slept_s, 3),
            }


def _litellm() -> Any:
    """Import litellm lazily (it is slow) and stop it printing help banners on every error,
    or a pydantic serializer warning on every reply (litellm's own response models, harmless)."""
    import litellm

    litellm.suppress_debug_info = True
    warnings.filterwarnings("ignore", message="Pydantic serializer warnings", category=UserWarning)
    return litellm


def classify(error: BaseException) -> tuple[ErrorKind, int | None]:
    """Map a litellm / openai exception to our error kind and its HTTP status."""
    import openai

    status = getattr(error, "status_code", None)
    text = str(error)
    if isinstance(error, openai.APITimeoutError):
        return "timeout", status
    if isinstance(error, openai.APIConnectionError) or "Connection error" in text:
        return "connection", status
    if status == 429:
        return "rate_limited", status
    if status in (401, 403):
        return "auth", status
    if isinstance(status, int) and (status >= 500 or status in (408, 409)):
        return "server_error", status
    if isinstance(error, openai.APIError) and status is None:
        return "server_error", status  # an unparseable body from the server
    return "bad_request", status


def retry_after_s(error: BaseException) -> float | None:
    """The server's Retry-After (seconds form), from wherever litellm kept the headers."""
    for headers in (
        getattr(error, "litellm_response_headers", None),
        getattr(getattr(error, "response", None), "headers", None),
    ):
        if not headers:
            continue
        value = headers.get("retry-after")
        if value is None:
            continue
        try:
            return max(0.0, float(value))
        except ValueError:
            return None  # an HTTP-date form: fall back to our own backoff
    return None


def backoff_s(settings: LLMRole, attempt: int, retry_after: float | None) -> float:
    """Exponential backoff for retry `attempt` (1-based); a server's Retry-After wins if longer,
    and is honoured even past our own cap, because asking earlier only earns another 429."""
    ours = min(settings.backoff_max_s, settings.backoff_s * 2 ** (attempt - 1))
    return max(ours, retry_after) if retry_after is not None else ours


class LLMClient:
    """`complete(messages)` for worker threads, `await acomplete(messages)` for event loops."""

    def __init__(
        self,
        settings: LLMRole,
        *,
        api_key: str | None = None,
        counters: LLMCounters | None = None,
        label: str = "llm",
    ) -> None:
        if settings.model is None:
            raise ValueError(
                f"{label}: an LLM client needs a model (role.embedded(...) for the run's own)"
            )
        self.settings = settings
        self.counters = counters or LLMCounters()
        self.label = label
        self._api_key = api_key

    def __repr__(self) -> str:  # never the key
        return f"LLMClient({self.settings.model!r}, api_base={self.settings.api_base!r})"

    def _key(self) -> str | None:
        if self._api_key is not None:
            return self._api_key
        if self.settings.api_key_env:
            value = os.environ.get(self.settings.api_key_env)
            if not value:
                raise LLMError(
                    f"{self.label}: environment variable {self.settings.api_key_env} is not set",
                    kind="auth",
                )
            return value
        return None  # litellm reads the provider's usual variable itself

    def _request(
        self, messages: Sequence[Mapping[str, object]], overrides: dict[str, object]
    ) -> dict:
        """litellm kwargs for one attempt (counted here, so every attempt is)."""
        self.counters.add(attempts=1)
        s = self.settings
        kwargs: dict[str, object] = {
            "model": s.model,
            "messages": list(messages),
            "timeout": s.timeout_s,
            "temperature": s.temperature,
            "max_tokens": s.max_tokens,
            "max_retries": 0,  # retries are ours: counted, logged, Retry-After aware
            "num_retries": 0,
        }
        if s.api_base:
            kwargs["api_base"] = s.api_base
        key = self._key()
        if key is not None:
            kwargs["api_key"] = key
        return kwargs | overrides

    def _reply(self, response: Any, attempts: int, began: float) -> LLMReply:
        choices = getattr(response, "choices", None) or []
        if not choices:
            raise LLMError(
                f"{self.label}: reply had no choices", kind="empty_reply", attempts=attempts
            )
        text = choices[0].message.content or ""
        if not text.strip():
            raise LLMError(f"{self.label}: reply was empty", kind="empty_reply", attempts=attempts)
        usage = getattr(response, "usage", None)
        return LLMReply(
            text=text,
            finish_reason=choices[0].finish_reason,
            attempts=attempts,
            seconds=time.monotonic() - began,
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        )

    def _failed(self, error: BaseException, attempt: int) -> tuple[LLMError, float | None]:
        """Count an error; return it as LLMError and the wait before the next try (None: stop)."""
        if isinstance(error, LLMError):
            kind, status = error.kind, error.status
        else:
            kind, status = classify(error)
        self.counters.error(kind)
        message = f"{self.label}: {kind}" + (f" (HTTP {status})" if status else "")
        wrapped = LLMError(
            f"{message}: {_short(error)}", kind=kind, status=status, attempts=attempt
        )
        if kind not in RETRYABLE or attempt > self.settings.max_retries:
            return wrapped, None
        wait = backoff_s(self.settings, attempt, retry_after_s(error))
        log.warning("%s; retry %d/%d in %.1fs", message, attempt, self.settings.max_retries, wait)
        return wrapped, wait

    def _give_up(self, error: LLMError) -> LLMError:
        self.counters.add(failed=1)
        log.error("%s (after %d attempt(s))", error, error.attempts)
        return error

    @tracing.op("art_rlvr.llm", inputs=tracing.llm_inputs)
    def complete(self, messages: Sequence[Mapping[str, object]], **overrides: Any) -> LLMReply:
        """Blocking call with retries (for threads: gepa's reflection runs in one)."""
        litellm, began = _litellm(), self._begin()
        for attempt in itertools.count(1):
            try:
                response = litellm.completion(**self._request(messages, overrides))
                return self._succeeded(response, attempt, began)
            except Exception as error:
                time.sleep(self._retry_wait(error, attempt))
        raise AssertionError("unreachable")

    @tracing.op("art_rlvr.llm", inputs=tracing.llm_inputs)
    async def acomplete(
        self, messages: Sequence[Mapping[str, object]], **overrides: Any
    ) -> LLMReply:
        """The same call on an event loop (litellm.acompletion, asyncio.sleep between tries)."""
        litellm, began = _litellm(), self._begin()
        for attempt in itertools.count(1):
            try:
                response = await litellm.acompletion(**self._request(messages, overrides))
                return self._succeeded(response, attempt, began)
            except Exception as error:
                await asyncio.sleep(self._retry_wait(error, attempt))
        raise AssertionError("unreachable")

    def _begin(self) -> float:
        self.counters.add(calls=1)
        return time.monotonic()

    def _succeeded(self, response: Any, attempt: int, began: float) -> LLMReply:
        reply = self._reply(response, attempt, began)  # raises on an empty or malformed reply
        self.counters.add(succeeded=1)
        return reply

    def _retry_wait(self, error: Exception, attempt: int) -> float:
        """Seconds to wait before the next attempt, or raise the counted, wrapped error."""
        wrapped, wait = self._failed(error, attempt)
        if wait is None:
            raise self._give_up(wrapped) from error
        self.counters.add(retries=1, slept_s=wait)
        return wait

    def __call__(self, prompt: str | Sequence[Mapping[str, object]]) -> str:
        """gepa's `LanguageModel` protocol: a prompt (or messages) in, text out."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return self.complete(messages).text


def _short(error: BaseException, limit: int = 300) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def missing_keys(settings: LLMRole) -> list[str]:
    """Environment variables litellm would need for this model and cannot find."""
    if settings.api_base or settings.api_key_env:
        return (
            []
            if not settings.api_key_env or os.environ.get(settings.api_key_env)
            else [settings.api_key_env]
        )
    report = _litellm().validate_environment(model=settings.model)
    return list(report.get("missing_keys") or [])


def embedded_role(model: Any, role: LLMRole, timeout_s: float) -> tuple[LLMRole, str]:
    """The role (and the in-memory key) reaching an ART model through its own OpenAI-compatible
    endpoint: the weak-but-real fallback reflector or teacher when no model is configured."""
    served = role.embedded(
        f"openai/{model.get_inference_name()}", model.inference_base_url, timeout_s
    )
    return served, str(model.inference_api_key)


def key_problem(role: LLMRole, name: str) -> str | None:
    """Why the LM configured for the role called `name` cannot be called: the key variables
    it needs and cannot find (None for the embedded model). The CLI asks before any model
    loads; `client_for` again when the role's client is made."""
    missing = missing_keys(role) if role.model is not None else []
    if not missing:
        return None
    return (
        f"{name}.model {role.model!r} needs {', '.join(missing)} in the environment "
        f"(or leave {name}.model unset to use the embedded model)"
    )


EMBEDDED_MIN_TIMEOUT_S = 600.0


def client_for(
    role: LLMRole, model: Any, *, name: str, counters: LLMCounters
) -> tuple[LLMClient, str]:
    """The LM configured for the role called `name` ("reflection", "teacher"), or, with
    `role.model` unset, the embedded `model` through its own endpoint (logged as weak but real).
    Returns the client and a name for summaries. A provider whose key is missing is an error
    before any call."""
    if role.model is None:
        # a CPU model writing a long reply to a long prompt, next to rollouts, can take minutes
        timeout = max(role.timeout_s, EMBEDDED_MIN_TIMEOUT_S)
        settings, key = embedded_role(model, role, timeout)
        log.warning(
            "%s LM: no %s.model configured, so the embedded model %s is used through its own "
            "endpoint (%s): weak but real",
            name,
            name,
            settings.model,
            settings.api_base,
        )
        client = LLMClient(settings, api_key=key, counters=counters, label=name)
        return client, f"embedded:{settings.model}"
    if problem := key_problem(role, name):
        raise ValueError(problem)
    where = f" at {role.api_base}" if role.api_base else ""
    log.info("%s LM: %s%s", name, role.model, where)
    return LLMClient(role, counters=counters, label=name), role.model


__all__ = [
    "FATAL",
    "RETRYABLE",
    "LLMClient",
    "LLMCounters",
    "LLMError",
    "LLMReply",
    "LLMRole",
    "backoff_s",
    "classify",
    "client_for",
    "embedded_role",
    "key_problem",
    "missing_keys",
    "retry_after_s",
]
