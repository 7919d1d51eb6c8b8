"""Hostile and malformed requests against the real server: every one is answered (4xx with a
message that names the field, or a normal 200), never a 5xx, and the server serves afterwards.

A table of hand-written cases (what an outside tester tried, and the neighbours of each), then
a property-based fuzzer (hypothesis, seeded and bounded) that mutates a valid request field by
field with arbitrary JSON, hostile strings, schemas and message shapes.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

USER = {"role": "user", "content": "Say hi."}
ESCAPE = "{{ ''.__class__.__mro__[1].__subclasses__() }}"


def assistant(**fields: Any) -> list[dict[str, Any]]:
    return [USER, {"role": "assistant", "content": None, **fields}]


CASES: list[tuple[str, dict[str, Any], str]] = [
    # message shapes (tool_calls as a string or a list of non-objects were 500s)
    ("tool_calls a string", {"messages": assistant(tool_calls="abc")}, "tool_calls"),
    ("tool_calls of ints", {"messages": assistant(tool_calls=[1, 2])}, "tool_calls.0"),
    ("tool_call no function", {"messages": assistant(tool_calls=[{"id": "a"}])}, "function"),
    ("function a string", {"messages": assistant(tool_calls=[{"function": "f"}])}, "function"),
    (
        "function without name",
        {"messages": assistant(tool_calls=[{"function": {"arguments": "{}"}}])},
        "name",
    ),
    (
        "arguments a number",
        {"messages": assistant(tool_calls=[{"function": {"name": "f", "arguments": 3}}])},
        "arguments",
    ),
    ("no role", {"messages": [{"content": "hi"}]}, "role"),
    ("role a number", {"messages": [{"role": 1, "content": "hi"}]}, "role"),
    ("empty role", {"messages": [{"role": "", "content": "hi"}]}, "role"),
    ("content a number", {"messages": [{"role": "user", "content": 5}]}, "content"),
    ("content an object", {"messages": [{"role": "user", "content": {"a": 1}}]}, "content"),
    ("content parts of ints", {"messages": [{"role": "user", "content": [1]}]}, "content"),
    (
        "a text part without text",
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        "text",
    ),
    (
        "an image part",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "text parts",
    ),
    ("a tool message without content", {"messages": [USER, {"role": "tool"}]}, "content"),
    ("a message that is a string", {"messages": ["hi"]}, "messages.0"),
    ("messages an object", {"messages": {"role": "user"}}, "messages"),
    (
        "tool_call_id a number",
        {"messages": [USER, {"role": "tool", "content": "1", "tool_call_id": 5}]},
        "tool_call_id",
    ),
    # per-request templates (a syntax error, raise_exception, a sandbox escape were 500s)
    (
        "template syntax error",
        {"chat_template_kwargs": {"chat_template": "{% for %}"}},
        "chat_template",
    ),
    (
        "template raises",
        {"chat_template_kwargs": {"chat_template": "{{ raise_exception('x') }}"}},
        "chat_template",
    ),
    ("template escape", {"chat_template_kwargs": {"chat_template": ESCAPE}}, "chat_template"),
    (
        "template path",
        {"chat_template_kwargs": {"chat_template_path": "/etc/passwd"}},
        "chat_template_path",
    ),
    # the server's own apply_chat_template keywords
    ("tokenize off", {"chat_template_kwargs": {"tokenize": False}}, "tokenize"),
    (
        "truncation",
        {"chat_template_kwargs": {"truncation": True, "max_length": 2}},
        "set by the server",
    ),
    ("return_tensors", {"chat_template_kwargs": {"return_tensors": "pt"}}, "return_tensors"),
    ("tools in kwargs", {"chat_template_kwargs": {"tools": 5}}, "tools"),
    ("messages in kwargs", {"chat_template_kwargs": {"messages": []}}, "messages"),
    ("not a name", {"chat_template_kwargs": {"a b": 1}}, "a b"),
    ("kwargs a list", {"chat_template_kwargs": [1]}, "chat_template_kwargs"),
    # schemas, tools, sampling
    (
        "tool parameters a list",
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
        "parameters",
    ),
    (
        "tool name with spaces",
        {"tools": [{"type": "function", "function": {"name": "a b"}}]},
        "name",
    ),
    (
        "schema a number",
        {"response_format": {"type": "json_schema", "json_schema": {"schema": 5}}},
        "schema",
    ),
    ("json_schema missing", {"response_format": {"type": "json_schema"}}, "json_schema"),
    ("unknown format", {"response_format": {"type": "yaml"}}, "response_format"),
    ("stop a number", {"stop": 5}, "stop"),
    ("n too large", {"n": 10_000}, "n"),
    ("max_tokens huge", {"max_tokens": 2**63}, "context length"),
    ("max_tokens negative", {"max_tokens": -1}, "max_tokens"),
    ("top_p zero", {"top_p": 0}, "top_p"),
    ("temperature a string", {"temperature": "hot"}, "temperature"),
    ("seed a float", {"seed": 1.5}, "seed"),
    ("logprobs a list", {"logprobs": [1]}, "logprobs"),
]


def post(model, body: Any, *, raw: bytes | None = None) -> httpx.Response:
    """One request on its own connection (a server error closes it)."""
    with httpx.Client(
        base_url=model.inference_base_url,
        headers={"Authorization": f"Bearer {model.inference_api_key}"},
        timeout=300,
    ) as client:
        if raw is not None:
            return client.post(
                "/chat/completions", content=raw, headers={"Content-Type": "application/json"}
            )
        return client.post("/chat/completions", json=body)


def valid(model) -> dict[str, Any]:
    return {"model": model.get_inference_name(), "messages": [USER], "max_tokens": 2}


def assert_answered(response: httpx.Response) -> None:
    """Not a server error: a 4xx carries a message; a 200 stream reports no failure in-band."""
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        message = response.json()["error"]["message"]
        assert isinstance(message, str) and message
    elif response.headers.get("content-type", "").startswith("text/event-stream"):
        assert "server_error" not in response.text, response.text


@pytest.mark.parametrize(
    ("body", "names"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_hostile_request_is_a_400_that_names_the_field(model, body, names) -> None:
    response = post(model, {**valid(model), **body})
    assert response.status_code == 400, response.text
    assert names in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"[]", b'"x"', b"null", b'{"messages": NaN}', b"\xff\xfe", b'{"model": "\\ud800"}'],
)
def test_a_body_that_is_not_a_request_object_is_a_400(model, raw) -> None:
    response = post(model, None, raw=raw)
    assert response.status_code == 400, response.text


def test_odd_but_valid_messages_are_served(model) -> None:
    """What the renderer can read is served as before: any role name, a NUL, a lone-surrogate
    escape as text, tool calls with object arguments, text parts, ART's template variable."""
    for messages in (
        [{"role": "wizard", "content": "hi"}],
        [{"role": "user", "content": "\x00 \\ud800 {{ 7*7 }}"}],
        [
            *assistant(tool_calls=[{"id": "c", "function": {"name": "f", "arguments": {"a": 1}}}]),
            {"role": "tool", "content": [{"type": "text", "text": "1"}], "tool_call_id": "c"},
        ],
    ):
        body = {**valid(model), "messages": messages}
        body["chat_template_kwargs"] = {"preserve_thinking": True, "enable_thinking": False}
        response = post(model, body)
        assert response.status_code == 200, response.text


# ------------------------------------------------------------------ the fuzzer

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["{{ 7*7 }}", ESCAPE, "{% for %}", "\x00", "<tool_call>", "token_id:1"])
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
SMALL_TOKENS = st.integers(-2, 3) | st.sampled_from([0, 4096, 2**40]) | JSON
SCHEMA = st.fixed_dictionaries(
    {"type": st.sampled_from(["object", "string", "array", "integer", "nope"]) | JSON},
    optional={
        "properties": st.dictionaries(
            st.text(max_size=4), JSON | st.just({"type": "string"}), max_size=3
        ),
        "required": JSON,
        "items": JSON,
        "enum": JSON,
        "pattern": st.sampled_from(["[", "a+", "(?<=x)", ".*"]) | JSON,
        "minimum": JSON,
        "$ref": st.sampled_from(["#/x", "#", "http://127.0.0.1/"]) | JSON,
    },
)
TOOL = st.fixed_dictionaries(
    {"type": st.just("function") | JSON, "function": st.fixed_dictionaries(
        {"name": st.sampled_from(["f", "g", "a b", ""]) | JSON},
        optional={"parameters": SCHEMA | JSON, "description": JSON, "strict": JSON},
    ) | JSON},
)  # fmt: skip
CALL = st.fixed_dictionaries(
    {"function": st.fixed_dictionaries(
        {"name": st.just("f") | JSON}, optional={"arguments": st.just('{"a": 1}') | JSON}
    ) | JSON},
    optional={"id": JSON, "type": JSON},
)  # fmt: skip
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "x"]) | JSON},
    optional={
        "content": st.text(max_size=20)
        | st.lists(st.fixed_dictionaries({"type": st.just("text") | JSON, "text": JSON}), max_size=2)
        | JSON,
        "tool_calls": st.lists(CALL, max_size=2) | JSON,
        "tool_call_id": JSON,
        "name": JSON,
    },
)  # fmt: skip
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "messages": st.lists(MESSAGE, max_size=3) | JSON,
    "n": st.integers(-1, 3) | JSON,
    "max_tokens": SMALL_TOKENS,
    "max_completion_tokens": SMALL_TOKENS,
    "temperature": JSON,
    "top_p": JSON,
    "stop": JSON,
    "seed": JSON,
    "logprobs": JSON,
    "top_logprobs": JSON,
    "stream": st.booleans() | JSON,
    "stream_options": JSON,
    "tools": st.lists(TOOL, max_size=2) | JSON,
    "tool_choice": st.sampled_from(["none", "auto", "required"])
    | st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({"name": st.just("f") | JSON})})
    | JSON,
    "parallel_tool_calls": JSON,
    "response_format": st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema"]) | JSON},
        optional={"json_schema": st.fixed_dictionaries({}, optional={"schema": SCHEMA | JSON, "name": JSON})},
    )
    | JSON,
    "ignore_eos": JSON,
    "return_token_ids": JSON,
    "return_tokens_as_token_ids": JSON,
    "chat_template_kwargs": st.dictionaries(st.sampled_from(["x", "enable_thinking", "tokenize", "chat_template", "a b", ""]), JSON, max_size=2) | JSON,
    "model": st.text(max_size=10) | JSON,
}  # fmt: skip


def bounded(body: dict[str, Any]) -> dict[str, Any]:
    """Keep generation short whatever the mutation: a token budget that is a small int or an
    invalid value (never the server's default of 256 tokens)."""
    if "max_tokens" not in body and not isinstance(body.get("max_completion_tokens"), int):
        body["max_tokens"] = 1
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 4 < value < 4096:
            body[key] = 4
    return body


@st.composite
def requests(draw: st.DrawFn) -> Any:
    """A valid request with one to four fields replaced, removed or added; sometimes not an
    object at all."""
    if draw(st.integers(0, 19)) == 0:
        return draw(JSON)
    body: dict[str, Any] = {"messages": [USER], "max_tokens": 1}
    for key in draw(st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=4, unique=True)):
        if draw(st.integers(0, 9)) == 0:
            body.pop(key, None)
        else:
            body[key] = draw(FIELDS[key])
    return bounded(body)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)  # fmt: skip
@given(body=requests())
def test_fuzzed_requests_never_get_a_server_error(model, body) -> None:
    """150 seeded mutations (about a minute on 2 cores): no 5xx, no in-band stream failure."""
    if isinstance(body, dict) and body.get("model") is None:
        body = {**body, "model": model.get_inference_name()}
    try:
        raw = json.dumps(body).encode()
    except ValueError:  # hypothesis drew something JSON cannot carry: not a request
        return
    assert_answered(post(model, None, raw=raw))


def test_the_server_serves_after_the_hostile_requests(model) -> None:
    response = post(model, valid(model))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"
