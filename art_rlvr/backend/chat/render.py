"""Chat rendering and tool-call parsing, shared by the server and the trainer.

A conversation is turned into token ids in one place, so what was served is what is trained.
Models whose chat template knows about tools get their own template (OpenAI-style messages,
arguments parsed to objects, as vLLM hands them to Hugging Face templates). Templates that
render only role and content (SmolLM2's) get the Hermes convention that vLLM's `hermes` tool
parser reads, spelled out in text the template can carry:

- the tool schemas go into the system message (an existing one is kept, the block appended;
  otherwise the block *is* the system message, replacing the template's default line), with
  the instruction to answer with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
- an assistant message with `tool_calls` (content may be null) becomes its content followed by
  one `<tool_call>` block per call, arguments written exactly as the call carried them;
- consecutive `tool` messages become one `user` message of `<tool_response>` blocks that name
  the tool and its `tool_call_id`, so templates that insist on user/assistant turns accept it.
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Required, TypedDict

import jinja2
import jinja2.meta

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


class Function(TypedDict):
    name: str
    arguments: object  # a JSON string (the model's own text, as OpenAI sends it) or an object


class ToolCall(TypedDict):
    id: str
    type: str
    function: Function


class ChatMessage(TypedDict, total=False):
    """A message in the one shape rendering reads (`canonical_message`)."""

    role: Required[str]
    content: Required[object]  # text, a list of content parts, or None
    tool_calls: list[ToolCall]
    tool_call_id: str


HERMES_TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


@functools.lru_cache(maxsize=16)
def longest_token_chars(tokenizer) -> int:
    """The most characters one token of `tokenizer` spells (its vocabulary's and added
    tokens'); ~20 ms once per tokenizer."""
    return max(map(len, tokenizer.get_vocab()), default=1)


def render_ids(
    tokenizer,
    messages: Sequence[dict[str, object]],
    tools: Sequence[dict[str, object]] | None = None,
    *,
    add_generation_prompt: bool = True,
    **template_kwargs: object,
) -> list[int]:
    """Token ids of `messages` (OpenAI chat format) under the model's chat template."""
    template_kwargs.pop("preserve_thinking", None)  # ART's vLLM-only switch
    tools = canonical_tools(tools)
    if template_supports_tools(tokenizer):
        rendered = tokenizer.apply_chat_template(
            [_native_message(m) for m in messages],
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            **template_kwargs,
        )
    else:
        rendered = tokenizer.apply_chat_template(
            hermes_messages(messages, tools),
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            **template_kwargs,
        )
    return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)


def canonical_tools(tools: Sequence[object] | None) -> list[dict[str, object]] | None:
    """Tool dicts in one key order, whatever order a client or ART stored them in.

    The rendered prompt spells the tools out as JSON, so key order is part of the prompt: ART's
    `Trajectory.tools` puts "function" before "type" while clients send "type" first, and the
    trainer must render exactly what the server rendered. The schema inside `parameters` is the
    client's own text and keeps its order.
    """
    out = []
    for tool in tools or []:
        plain = _plain(tool)
        function = _plain(plain.get("function") or {})
        known = {k: function[k] for k in _FUNCTION_KEYS if function.get(k) is not None}
        out.append({"type": plain.get("type", "function"), "function": known})
    return out or None


_FUNCTION_KEYS = ("name", "description", "parameters", "strict")


def template_supports_tools(tokenizer) -> bool:
    """Whether the chat template reads a `tools` variable (parsed, not a substring match)."""
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default")
    return isinstance(template, str) and _reads_tools(template)


@lru_cache(maxsize=16)
def _reads_tools(template: str) -> bool:
    try:
        parsed = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return False
    return "tools" in jinja2.meta.find_undeclared_variables(parsed)


def hermes_messages(
    messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]] | None
) -> list[dict[str, str]]:
    """Role + content messages carrying tools, calls and results in Hermes text."""
    out: list[dict[str, str]] = []
    names: dict[str, str] = {}
    for raw in messages:
        message = canonical_message(raw)
        role = message["role"]
        if role == "tool":
            call_id = message.get("tool_call_id") or ""
            block = _tool_response(names.get(call_id), call_id, text_content(message["content"]))
            if (
                out
                and out[-1]["role"] == "user"
                and out[-1]["content"].endswith("</tool_response>")
            ):
                out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + block}
            else:
                out.append({"role": "user", "content": block})
            continue
        content = text_content(message.get("content"))
        calls = message.get("tool_calls") or []
        names |= {c["id"]: c["function"]["name"] for c in calls}
        blocks = [tool_call_text(c["function"]["name"], c["function"]["arguments"]) for c in calls]
        content = "\n".join([content, *blocks] if content else blocks)
        out.append({"role": "system" if role == "developer" else role, "content": content})
    if tools := canonical_tools(tools):
        block = HERMES_TOOLS_PROMPT.format(
            tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        )
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def tool_call_text(name: str, arguments: object) -> str:
    """One Hermes call block; a JSON-string argument is kept verbatim (the model's own text)."""
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
        except json.JSONDecodeError:
            arguments = json.dumps(arguments, ensure_ascii=False)
    else:
        arguments = json.dumps(arguments, ensure_ascii=False)
    head = json.dumps(name, ensure_ascii=False)
    return f'{TOOL_CALL_OPEN}\n{{"name": {head}, "arguments": {arguments}}}\n{TOOL_CALL_CLOSE}'


def _tool_response(name: str | None, call_id: str, content: str) -> str:
    head = json.dumps({"name": name, "tool_call_id": call_id}, ensure_ascii=False)
    return f"<tool_response>\n{head}\n{content}\n</tool_response>"


def _native_message(raw: object) -> ChatMessage:
    """What Hugging Face tool templates expect: text content, arguments as objects."""
    message = canonical_message(raw)
    message["content"] = text_content(message["content"]) if message["content"] else None
    if message.get("tool_calls"):
        message["tool_calls"] = [
            {**c, "function": {**c["function"], "arguments": _arguments_object(c["function"])}}
            for c in message["tool_calls"]
        ]
    return message


def canonical_message(raw: object) -> ChatMessage:
    """The fields a chat template reads, in one shape, whatever the client added: LangChain's
    tool calls carry `args` and `name` beside `function`, the OpenAI SDK's objects `None`s."""
    message = _plain(raw)
    out: ChatMessage = {"role": message["role"], "content": message.get("content")}
    if calls := message.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": call.get("id", ""),
                "type": "function",
                "function": {
                    "name": (function := _plain(call["function"]))["name"],
                    "arguments": function.get("arguments", "{}"),
                },
            }
            for call in map(_plain, calls)
        ]
    if message.get("tool_call_id") is not None:
        out["tool_call_id"] = message["tool_call_id"]
    return out


def _arguments_object(function: Function) -> object:
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def _plain(value: Any) -> dict[str, Any]:
    """Pydantic objects (the OpenAI SDK's) to dicts; dicts copied. What a client sent, before
    its shape is known: the one place its fields are read untyped."""
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=True)
    return dict(value)


def text_content(content: object) -> str:
    """A message's text: a string, or the text parts of a content list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") for part in map(_plain, content) if part.get("type") == "text"
        )
    raise ValueError(f"unsupported message content of type {type(content).__name__}")


# ------------------------------------------------------------------ parsing

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_UNTERMINATED = re.compile(r"<tool_call>(.*)", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """Split a completion into content and OpenAI `tool_calls`.

    Every well-formed `<tool_call>` block (a JSON object with a string `name` and an object
    `arguments`) becomes a call with arguments as a JSON string (as vLLM's hermes parser
    writes them), a last block left unclosed included; anything else stays in the content,
    so nothing the model wrote is lost. Content is None when nothing else is left.
    """
    content, calls = scan(text, final=True)
    return content or None, calls


def scan(text: str, *, final: bool) -> tuple[str, list[ToolCall]]:
    """Content and calls of `text`; with `final=False`, only what can no longer change as more
    text arrives (for streaming: an open block or a partial tag or trailing whitespace is held
    back), so the pieces streamed add up to the final result."""
    pieces: list[str] = []
    calls: list[ToolCall] = []
    position = 0
    for match in _BLOCK.finditer(text):
        pieces.append(text[position : match.start()])
        call = _call(match.group(1))
        if call is None:
            pieces.append(match.group(0))
        else:
            calls.append(call)
        position = match.end()
    rest = text[position:]
    if not final:
        rest = rest[: _held_back(rest)]
    elif (tail := _UNTERMINATED.search(rest)) and (call := _call(tail.group(1))) is not None:
        calls.append(call)  # the model stopped before closing its last block (vLLM reads it too)
        rest = rest[: tail.start()]
    content = "".join([*pieces, rest]).lstrip()
    return (content.rstrip() if final else content[: len(content.rstrip())]), calls


def _held_back(rest: str) -> int:
    """Where the undecided tail of `rest` starts: an open block or a partial opening tag."""
    opened = rest.find(TOOL_CALL_OPEN)
    if opened >= 0:
        return opened
    for size in range(min(len(TOOL_CALL_OPEN) - 1, len(rest)), 0, -1):
        if TOOL_CALL_OPEN.startswith(rest[-size:]):
            return len(rest) - size
    return len(rest)


def _call(body: str) -> ToolCall | None:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if not isinstance(arguments, dict):
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": data["name"], "arguments": _arguments_text(body, data, arguments)},
    }


def _arguments_text(body: str, data: dict[str, object], arguments: dict[str, object]) -> str:
    """The model's own argument text when the block has the canonical shape (so rendering the
    call back reproduces what was sampled), else the arguments re-serialised as vLLM does."""
    prefix = f'{{"name": {json.dumps(data["name"], ensure_ascii=False)}, "arguments": '
    text = body.strip()
    if len(data) == 2 and text.startswith(prefix) and text.endswith("}"):
        raw = text[len(prefix) : -1]
        try:
            if json.loads(raw) == arguments:
                return raw
        except json.JSONDecodeError:
            pass
    return json.dumps(arguments, ensure_ascii=False)
