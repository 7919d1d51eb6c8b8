"""Tool calling, constrained decoding and streaming: the OpenAI SDK against the real server."""

from __future__ import annotations

import asyncio
import copy
import json

import httpx
import jsonschema
import pytest
import torch
from art.openai import consume_chat_completion_stream
from openai.lib.streaming.chat import ChatCompletionStreamState

from art_rlvr.backend.chat.render import parse_tool_calls, render_ids, template_supports_tools

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


async def create(model, **kwargs):
    kwargs.setdefault("messages", ASK)
    return await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), **kwargs
    )


def tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


SHORT = {"type": "string", "maxLength": 16}
SCHEMAS = {
    "flat_required": {
        "type": "object",
        "properties": {"query": SHORT, "limit": {"type": "integer"}},
        "required": ["query", "limit"],
    },
    "enum_and_bool": {
        "type": "object",
        "properties": {"level": {"enum": ["low", "mid", "high"]}, "urgent": {"type": "boolean"}},
        "required": ["level", "urgent"],
    },
    "nested_object": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"name": SHORT, "age": {"type": "integer", "minimum": 0}},
                "required": ["name", "age"],
            },
            "note": SHORT,
        },
        "required": ["user"],
    },
    "array_of_objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"sku": SHORT, "qty": {"type": "integer"}},
                    "required": ["sku", "qty"],
                },
            }
        },
        "required": ["items"],
    },
    "array_of_enums_and_number": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
            "score": {"type": "number"},
        },
        "required": ["tags", "score"],
    },
    "optional_only": {"type": "object", "properties": {"verbose": {"type": "boolean"}}},
}


@pytest.mark.parametrize("name", list(SCHEMAS))
async def test_named_tool_choice_gives_schema_valid_arguments(model, name) -> None:
    """Constrained decoding: every sampled reply is exactly one call to the named tool whose
    arguments validate against its schema (temperature 1, four samples per schema)."""
    schema = SCHEMAS[name]
    response = await create(
        model,
        messages=[{"role": "user", "content": "Use the tool."}],
        tools=[tool(name, schema), ADD],
        tool_choice={"type": "function", "function": {"name": name}},
        n=4,
        max_tokens=160,
        temperature=1.0,
        seed=3,
    )
    for choice in response.choices:
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        assert call.function.name == name and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), schema)


@pytest.mark.parametrize("parallel", [False, True])
async def test_required_calls_one_of_the_tools(model, parallel) -> None:
    response = await create(
        model,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=parallel,
        n=3,
        max_tokens=160,
        seed=5,
    )
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for choice in response.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        assert parallel or len(choice.message.tool_calls) == 1
        for call in choice.message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name])


async def test_auto_renders_the_tools_and_answers_in_openai_shape(model, backend) -> None:
    """With `auto` the model may call or not; either way the reply is well formed, and the
    prompt the model saw lists the tools (the fallback rendering for SmolLM2's template)."""
    response = await create(model, tools=TOOLS, n=4, max_tokens=60, seed=11)
    prompt = base_tokenizer(backend).decode(response.choices[0].model_extra["prompt_token_ids"])
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt
    for choice in response.choices:
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            assert {c.function.name for c in choice.message.tool_calls} <= {"get_weather", "add"}
        else:
            assert choice.finish_reason in ("stop", "length")
            assert choice.message.content is not None


async def test_tool_choice_none_never_parses_calls(model) -> None:
    """`none` (vLLM's default without tools): the text is the content, whatever it holds."""
    response = await create(model, tools=TOOLS, tool_choice="none", max_tokens=30, seed=2)
    assert response.choices[0].message.tool_calls is None
    assert response.choices[0].finish_reason in ("stop", "length")


def base_tokenizer(backend):
    return next(iter(backend._bases.values())).tokenizer


async def test_history_with_calls_and_results_round_trips(model, backend) -> None:
    """A sampled call (content null), sent back with two tool results, then a second turn.
    The second prompt contains the first prompt and the sampled call text unchanged, so what
    was sampled is what training re-renders."""
    first = await create(
        model,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=True,
        max_tokens=160,
        seed=1,
    )
    message = first.choices[0].message
    assert message.content is None and message.tool_calls
    results = [
        {"role": "tool", "tool_call_id": call.id, "content": f"result {i}"}
        for i, call in enumerate(message.tool_calls)
    ]
    history = [*ASK, message.model_dump(exclude_none=True), *results]
    second = await create(model, messages=history, tools=TOOLS, max_tokens=20, seed=1)
    tok = base_tokenizer(backend)
    sampled = tok.decode(
        first.choices[0].model_extra["prompt_token_ids"] + first.choices[0].model_extra["token_ids"]
    )
    again = tok.decode(second.choices[0].model_extra["prompt_token_ids"])
    assert again.startswith(sampled)
    for call, result in zip(message.tool_calls, results, strict=True):
        assert f'"tool_call_id": "{call.id}"' in again and result["content"] in again


async def test_hand_written_history_with_two_calls_in_one_turn(model, backend) -> None:
    calls = [
        {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
        }
        for i, city in enumerate(["Paris", "Rome"])
    ]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c0", "content": "sunny, 21 C"},
        {"role": "tool", "tool_call_id": "c1", "content": "rain, 14 C"},
    ]
    response = await create(model, messages=history, tools=TOOLS, max_tokens=24, temperature=0)
    prompt = base_tokenizer(backend).decode(response.choices[0].model_extra["prompt_token_ids"])
    assert prompt.count("<tool_call>\n") == 2 + 1  # two calls + the format instruction
    assert "sunny, 21 C" in prompt and "rain, 14 C" in prompt
    assert response.choices[0].finish_reason in ("stop", "length", "tool_calls")


async def test_constrained_and_free_rows_batch_together_unchanged(model, backend) -> None:
    """A grammar is a per-row mask: a free request sampled next to a constrained one (sent
    together, so prefilled and decoded in one batch) gets the same tokens as alone."""
    free = {"max_tokens": 12, "temperature": 1.0, "seed": 21}
    alone = await create(model, **free)
    together, forced = await asyncio.gather(
        create(model, **free),
        create(model, tools=TOOLS, tool_choice="required", max_tokens=60, seed=2),
    )
    assert forced.choices[0].message.tool_calls
    if backend.dtype != torch.float32:
        pytest.skip("bf16 logits depend on the batch's shape; the exact check needs fp32")
    assert together.choices[0].model_extra["token_ids"] == alone.choices[0].model_extra["token_ids"]


ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
}


@pytest.mark.parametrize(
    ("response_format", "schema"),
    [
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}, ANSWER),
        ({"type": "json_object"}, {"type": "object"}),
    ],
)
async def test_response_format_gives_valid_json(model, response_format, schema) -> None:
    response = await create(
        model,
        messages=[{"role": "user", "content": "What is 2 + 3?"}],
        response_format=response_format,
        n=3,
        max_tokens=80,
        seed=4,
    )
    for choice in response.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), schema)


STREAM_CASES = {
    "plain": {"max_tokens": 40, "temperature": 1.0},
    "stop_string": {"max_tokens": 60, "temperature": 0, "stop": [", 4"]},
    "named_tool": {
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 120,
    },
    "required_parallel": {"tools": TOOLS, "tool_choice": "required", "max_tokens": 160},
    "auto": {"tools": TOOLS, "max_tokens": 60},
}


@pytest.mark.parametrize("case", list(STREAM_CASES))
async def test_stream_equals_non_streamed(model, case) -> None:
    """Same seed, stream or not: the same token ids, and the SDK assembles the streamed chunks
    (tool-call deltas included) into the same message, finish reason and usage."""
    kwargs = {
        "messages": [{"role": "user", "content": "Count from 1 to 9, separated by commas."}],
        "seed": 9,
        **STREAM_CASES[case],
    }
    if "tools" in kwargs:
        kwargs["messages"] = ASK
    whole = await create(model, **kwargs)
    tokens: list[int] = []
    state = ChatCompletionStreamState()  # the SDK's own assembler of chunks and deltas
    stream = await create(model, stream=True, stream_options={"include_usage": True}, **kwargs)
    async for chunk in stream:
        state.handle_chunk(chunk)
        if chunk.choices:
            tokens.extend(chunk.choices[0].model_extra.get("token_ids") or [])
    streamed = state.current_completion_snapshot
    expected, got = whole.choices[0], streamed.choices[0]
    assert tokens == expected.model_extra["token_ids"]
    assert got.finish_reason == expected.finish_reason
    assert (got.message.content or None) == expected.message.content
    assert [(c.function.name, c.function.arguments) for c in got.message.tool_calls or []] == [
        (c.function.name, c.function.arguments) for c in expected.message.tool_calls or []
    ]
    assert streamed.usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize("stream", [False, True])
async def test_every_choice_carries_arts_policy_spans(model, stream) -> None:
    """ART's client on TorchBackend requires policy provenance (as on ART's own runtime): one
    span per choice over every completion token, the step that served it; ART's stream
    assembler checks the streamed spans against the streamed token ids."""
    kwargs = {"max_tokens": 8, "temperature": 1.0, "seed": 4, "n": 2}
    response = await create(model, stream=stream, **kwargs)
    if stream:
        response = await consume_chat_completion_stream(response)
    step = await model.get_step()
    for choice in response.choices:
        extra = choice.model_extra
        [span] = extra["policy_token_spans"]
        assert (span["start_token"], span["end_token"]) == (0, len(extra["token_ids"]))
        assert span["policy_version"] == step
        [prompt] = extra["prompt_policy_token_spans"]
        assert (prompt["start_token"], prompt["end_token"]) == (1, len(extra["prompt_token_ids"]))


async def test_stream_carries_logprobs_and_prompt_ids(model) -> None:
    stream = await create(
        model, stream=True, max_tokens=12, logprobs=True, temperature=1.0, seed=2, n=2
    )
    seen: dict[int, list[float]] = {0: [], 1: []}
    prompt_ids = None
    async for chunk in stream:
        prompt_ids = prompt_ids or (chunk.model_extra or {}).get("prompt_token_ids")
        for choice in chunk.choices:
            if choice.logprobs and choice.logprobs.content:
                seen[choice.index].extend(t.logprob for t in choice.logprobs.content)
    whole = await create(model, max_tokens=12, logprobs=True, temperature=1.0, seed=2, n=2)
    assert prompt_ids == whole.choices[0].model_extra["prompt_token_ids"]
    for index, choice in enumerate(whole.choices):
        assert seen[index] == pytest.approx([t.logprob for t in choice.logprobs.content], abs=1e-4)


BAD = [
    ({"tool_choice": "required"}, "only allowed when tools are given"),
    ({"tool_choice": {"type": "function", "function": {"name": "add"}}}, "only allowed"),
    (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "'nope' is not among the tools",
    ),
    ({"tools": [WEATHER, WEATHER]}, "names must be unique"),
    ({"tools": [tool("bad name!", {"type": "object"})]}, "tools.0.function.name"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"response_format": {"type": "json_schema"}}, "needs a json_schema"),
    ({"logprobs": False, "top_logprobs": 2}, "only allowed when logprobs is true"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (
        {
            "tools": [tool("f", {"type": "object", "properties": {"x": {"type": "nonsense"}}})],
            "tool_choice": "required",
        },
        "cannot build a grammar",
    ),
    ({"messages": [{"role": "tool", "content": 5}]}, "content: must be a string"),
]


@pytest.mark.parametrize(("body", "message"), BAD)
async def test_bad_tool_requests_get_clear_400(model, body, message) -> None:
    payload = {"model": model.get_inference_name(), "messages": ASK, "max_tokens": 8, **body}
    async with httpx.AsyncClient(
        base_url=model.inference_base_url,
        headers={"Authorization": f"Bearer {model.inference_api_key}"},
    ) as client:
        for stream in (False, True):
            response = await client.post(
                "/chat/completions", json={**payload, "stream": stream}, timeout=120
            )
            assert response.status_code == 400, response.text
            assert message in response.json()["error"]["message"]


CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "content", "names"),
    [
        (CALL, None, ["add"]),
        (f"Let me add.\n{CALL}", "Let me add.", ["add"]),
        (f"{CALL}\n{CALL}", None, ["add", "add"]),
        ('<tool_call>{"name": "add", "arguments": {"a": 1}}', None, ["add"]),  # unclosed last
        ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
        ('<tool_call>{"name": "add"', '<tool_call>{"name": "add"', []),
        (
            '<tool_call>{"arguments": {}}</tool_call>',
            '<tool_call>{"arguments": {}}</tool_call>',
            [],
        ),
        ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', None, None),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', None, None),
        ('<tool_call>["add"]</tool_call>', '<tool_call>["add"]</tool_call>', []),
        (f"<tool_call>bad</tool_call>{CALL}", "<tool_call>bad</tool_call>", ["add"]),
        ("</tool_call> stray close", "</tool_call> stray close", []),
        ("no calls at all", "no calls at all", []),
        ("", None, []),
    ],
)
def test_parse_tool_calls_keeps_malformed_blocks_as_content(text, content, names) -> None:
    got_content, calls = parse_tool_calls(text)
    if names is None:  # a malformed block: kept verbatim, no call
        assert got_content == text and calls == []
        return
    assert got_content == content
    assert [c["function"]["name"] for c in calls] == names
    assert all(json.loads(c["function"]["arguments"]) is not None for c in calls)
    assert len({c["id"] for c in calls}) == len(calls)


def test_parse_keeps_the_models_argument_text() -> None:
    """Arguments in the canonical block keep their exact text (re-rendering reproduces the
    sampled call); other shapes are re-serialised as vLLM's hermes parser does."""
    raw = '{"a":1,  "b": 2}'
    _, (call,) = parse_tool_calls(
        f'<tool_call>\n{{"name": "add", "arguments": {raw}}}\n</tool_call>'
    )
    assert call["function"]["arguments"] == raw
    _, (call,) = parse_tool_calls('<tool_call>{"arguments": {"a":1}, "name": "add"}</tool_call>')
    assert call["function"]["arguments"] == '{"a": 1}'


TOOL_TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}[{{ c.function.name }} {{ c.function.arguments.x }}]"
    "{% endfor %}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_template_that_reads_tools_gets_them_natively(backend) -> None:
    """Detection parses the template (a `tools` variable), and such templates get the tools
    and arguments as objects (as vLLM hands them to Hugging Face templates)."""
    tok = copy.deepcopy(base_tokenizer(backend))
    assert not template_supports_tools(tok)
    tok.chat_template = TOOL_TEMPLATE
    assert template_supports_tools(tok)
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 7}'}}
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}]
    text = tok.decode(render_ids(tok, messages, [WEATHER]))
    assert text.startswith("TOOLS:get_weather;") and "[f 7]" in text
    tok.chat_template = "{# tools are not read here #}{{ messages[0].content }}"
    assert not template_supports_tools(tok)


async def test_forced_tool_with_response_format_uses_the_tool_grammar(model) -> None:
    """The OpenAI Agents SDK sends both for an agent with tools and a typed output; OpenAI and
    vLLM accept them: the forced call's grammar applies to the forcing turn, the response
    format to a turn that forces nothing."""
    answer = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}
    forced = await create(
        model, tools=TOOLS, tool_choice="required", response_format=answer, max_tokens=120, seed=1
    )
    choice = forced.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    free = await create(model, tools=TOOLS, response_format=answer, max_tokens=80, seed=1)
    assert not free.choices[0].message.tool_calls
    jsonschema.validate(json.loads(free.choices[0].message.content), ANSWER)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_cut_by_max_tokens_finishes_with_length(model, stream) -> None:
    """As on OpenAI and vLLM: the budget cut the reply, so "length", and the half-written call
    is not a call (its text stays in the content)."""
    kwargs = {"tools": TOOLS, "tool_choice": "required", "max_tokens": 6, "seed": 3}
    if stream:
        state = ChatCompletionStreamState()
        async for chunk in await create(model, stream=True, **kwargs):
            state.handle_chunk(chunk)
        choice = state.current_completion_snapshot.choices[0]
    else:
        choice = (await create(model, **kwargs)).choices[0]
    assert choice.finish_reason == "length"
    assert not choice.message.tool_calls
    assert choice.message.content.startswith("<tool_call>")


@pytest.mark.parametrize("k", [1, 5])
async def test_top_logprobs_are_the_most_likely_tokens_of_the_same_distribution(model, k) -> None:
    response = await create(model, max_tokens=6, temperature=0, logprobs=True, top_logprobs=k, n=1)
    entries = response.choices[0].logprobs.content
    ids = response.choices[0].model_extra["token_ids"]
    assert len(entries) == len(ids)
    for entry, token in zip(entries, ids, strict=True):
        top = entry.top_logprobs
        assert len(top) == k
        assert [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        assert sum(2.718281828459045**t.logprob for t in top) <= 1 + 1e-5
        # greedy: the sampled token is the most likely one, with the same logprob
        assert top[0].token == f"token_id:{token}" and top[0].logprob == entry.logprob


async def test_stream_carries_top_logprobs(model) -> None:
    kwargs = {"max_tokens": 5, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    streamed = []
    async for chunk in await create(model, stream=True, **kwargs):
        for choice in chunk.choices:
            if choice.logprobs and choice.logprobs.content:
                streamed += [[t.logprob for t in e.top_logprobs] for e in choice.logprobs.content]
    whole = (await create(model, **kwargs)).choices[0].logprobs.content
    assert streamed == [[t.logprob for t in e.top_logprobs] for e in whole]


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_returns_the_first_call_only(parallel, stream) -> None:
    """Without constrained decoding (tool_choice auto) the model may write two calls; vLLM
    returns only the first when `parallel_tool_calls` is false, and so does the server."""
    from art_rlvr.backend.engine.generation import Completion
    from art_rlvr.backend.serving.chat_request import ChatRequest
    from art_rlvr.backend.serving.server import _ChoiceStream, _message

    text = f"{CALL}\n{CALL.replace('1', '5')}"
    req = ChatRequest.model_validate(
        {"model": "m", "messages": ASK, "tools": TOOLS, "parallel_tool_calls": parallel}
    )
    if stream:
        deltas = _ChoiceStream(True, [], None if parallel else 1).deltas(text, final=True)
        calls = [d["tool_calls"][0] for d in deltas if "function" in d.get("tool_calls", [{}])[0]]
        names = [c["function"]["name"] for c in calls if "name" in c["function"]]
    else:
        message, finish = _message(req, Completion([1], [0.0], text, "stop"))
        names = [c["function"]["name"] for c in message["tool_calls"]]
        assert finish == "tool_calls"
    assert names == (["add", "add"] if parallel else ["add"])
