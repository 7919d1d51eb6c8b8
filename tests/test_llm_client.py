"""The litellm client against a real scripted HTTP server on loopback: retries, backoff,
Retry-After, timeouts, resets, bad bodies, and keys that never leak."""

from __future__ import annotations

import time

import pytest

from art_rlvr.llm.client import (
    LLMClient,
    LLMCounters,
    LLMError,
    LLMRole,
    backoff_s,
    embedded_role,
)
from art_rlvr.testing import ScriptedServer, Step

KEY = "sk-scripted-do-not-leak-4711"
MESSAGES = [{"role": "user", "content": "Say hi."}]


def settings(server: ScriptedServer, **overrides) -> LLMRole:
    values = {
        "model": "openai/scripted",
        "api_base": server.base_url,
        "api_key_env": "SCRIPTED_LLM_KEY",
        "timeout_s": 5.0,
        "max_retries": 3,
        "backoff_s": 0.01,
        "backoff_max_s": 0.05,
    }
    return LLMRole(**(values | overrides))


@pytest.fixture(autouse=True)
def scripted_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCRIPTED_LLM_KEY", KEY)


def test_reply_sends_key_from_env_and_counts() -> None:
    with ScriptedServer([Step.reply("hello there")]) as server:
        client = LLMClient(settings(server))
        reply = client.complete(MESSAGES, max_tokens=7)
        (request,) = server.chat_requests
    assert reply.text == "hello there" and reply.finish_reason == "stop" and reply.attempts == 1
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body["messages"] == MESSAGES and request.body["max_tokens"] == 7
    assert client.counters.snapshot() | {"slept_s": 0} == {
        "calls": 1,
        "succeeded": 1,
        "failed": 0,
        "attempts": 1,
        "retries": 0,
        "errors": {},
        "error_total": 0,
        "slept_s": 0,
    }
    assert KEY not in repr(client) and KEY not in str(client.counters.snapshot())


def test_server_errors_are_retried_with_backoff() -> None:
    steps = [Step.error(500), Step.error(503), Step.error(502), Step.reply("finally")]
    with ScriptedServer(steps) as server:
        client = LLMClient(settings(server))
        reply = client.complete(MESSAGES)
        assert len(server.chat_requests) == 4
    assert reply.text == "finally" and reply.attempts == 4
    snap = client.counters.snapshot()
    assert snap["errors"] == {"server_error": 3} and snap["retries"] == 3
    assert snap["slept_s"] == pytest.approx(0.01 + 0.02 + 0.04)


def test_rate_limit_honours_retry_after() -> None:
    with ScriptedServer([Step.error(429, retry_after=0.4), Step.reply("ok")]) as server:
        client = LLMClient(settings(server))
        reply = client.complete(MESSAGES)
        first, second = server.chat_requests
    assert reply.text == "ok"
    assert second.at - first.at >= 0.4  # our own backoff would have waited 0.01 s
    assert client.counters.snapshot()["errors"] == {"rate_limited": 1}


def test_timeout_reset_and_malformed_body_are_retried() -> None:
    steps = [Step.timeout(1.5), Step.reset(), Step.malformed(), Step.reply("survived")]
    with ScriptedServer(steps) as server:
        client = LLMClient(settings(server, timeout_s=0.3))
        began = time.monotonic()
        reply = client.complete(MESSAGES)
        took = time.monotonic() - began
    assert reply.text == "survived" and reply.attempts == 4
    assert took < 1.5  # the slow reply was abandoned, not waited for
    assert client.counters.snapshot()["errors"] == {
        "timeout": 1,
        "connection": 1,
        "server_error": 1,
    }


def test_retries_run_out_into_a_counted_error() -> None:
    with ScriptedServer([Step.timeout(1.0)] * 3) as server:
        client = LLMClient(settings(server, timeout_s=0.2, max_retries=2))
        with pytest.raises(LLMError) as caught:
            client.complete(MESSAGES)
    assert caught.value.kind == "timeout" and caught.value.attempts == 3
    snap = client.counters.snapshot()
    assert snap["failed"] == 1 and snap["errors"] == {"timeout": 3} and snap["retries"] == 2


@pytest.mark.parametrize(
    ("step", "kind"),
    [(Step.error(401), "auth"), (Step.error(400), "bad_request"), (Step.empty(), "empty_reply")],
)
def test_non_retryable_errors_fail_at_once(step: Step, kind: str) -> None:
    with ScriptedServer([step, Step.reply("never reached")]) as server:
        client = LLMClient(settings(server))
        with pytest.raises(LLMError) as caught:
            client.complete(MESSAGES)
        assert len(server.chat_requests) == 1
    assert caught.value.kind == kind and not caught.value.retryable
    assert caught.value.fatal == (kind == "auth")
    assert client.counters.snapshot()["errors"] == {kind: 1}


def test_truncated_reply_comes_back_marked() -> None:
    with ScriptedServer([Step.truncated("```\nReply with only")]) as server:
        reply = LLMClient(settings(server)).complete(MESSAGES)
    assert reply.text == "```\nReply with only" and reply.finish_reason == "length"


def test_missing_key_variable_is_an_error_before_any_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SCRIPTED_LLM_KEY")
    with ScriptedServer([Step.reply("hi")]) as server:
        with pytest.raises(LLMError, match="SCRIPTED_LLM_KEY is not set") as caught:
            LLMClient(settings(server)).complete(MESSAGES)
        assert server.requests == []
    assert caught.value.fatal


async def test_async_path_retries_the_same_way() -> None:
    with ScriptedServer([Step.error(500), Step.reset(), Step.reply("async ok")]) as server:
        client = LLMClient(settings(server), counters=LLMCounters())
        reply = await client.acomplete(MESSAGES)
    assert reply.text == "async ok" and reply.attempts == 3
    assert client.counters.snapshot()["errors"] == {"server_error": 1, "connection": 1}


def test_backoff_is_exponential_capped_and_yields_to_retry_after() -> None:
    s = LLMRole(model="openai/x", backoff_s=1.0, backoff_max_s=5.0)
    assert [backoff_s(s, a, None) for a in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]
    assert backoff_s(s, 1, 3.0) == 3.0 and backoff_s(s, 4, 0.5) == 5.0
    assert backoff_s(s, 1, 30.0) == 30.0  # the server's word beats our cap


async def test_embedded_model_answers_through_its_own_endpoint(model) -> None:
    """The no-key fallback: litellm to the TorchBackend server of the model itself."""
    cfg, key = embedded_role(model, LLMRole(max_tokens=8, temperature=0.0), timeout_s=120.0)
    client = LLMClient(cfg, api_key=key)
    reply = await client.acomplete([{"role": "user", "content": "What is 2 + 2?"}])
    assert reply.text.strip() and reply.completion_tokens <= 8
    assert cfg.api_base == model.inference_base_url and key not in repr(client)


def test_a_client_needs_a_model() -> None:
    with pytest.raises(ValueError, match="needs a model"):
        LLMClient(LLMRole())
