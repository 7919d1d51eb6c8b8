"""Tools for episodes: plain Python functions as OpenAI tools, run so that nothing can stop an
episode.

A function's signature becomes one pydantic model (`pydantic.create_model`), which gives both
the JSON schema the model sees and the validator its arguments go through, so the two cannot
disagree; parameter descriptions come from the docstring's Args section (`docstring_parser`:
Google, NumPy, reST and Epydoc styles). Types are whatever pydantic understands: Optional,
Literal, enums, lists, nested pydantic models, TypedDicts. A callable that declares its own
JSON schema (`DeclaredTool`: an MCP server's tool) is shown that schema and gets the model's
JSON object as keyword arguments; checking them is its own job (an MCP server validates them).

`call_tool` never raises for the model's or the tool's faults: bad JSON, arguments that do not
validate, an unknown name, a tool that raises or outlives its timeout all become a
`ToolCallResult` whose `content` tells the model what went wrong (a `tool` message), with the
traceback kept in `error` for the logs. Sync tools run in a daemon thread of their own (a hung
one cannot starve a shared pool; Python cannot kill it, so it is abandoned, not stopped); async
tools are awaited and cancelled at their timeout. Output is stringified (str as is, pydantic
models and JSON-able values as JSON, anything else `str()`) and cut at `max_chars`.
"""

from __future__ import annotations

import enum
import inspect
import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Protocol, TypedDict, runtime_checkable

import docstring_parser
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from art_rlvr.core.callbacks import CallbackError, cap, guarded, off_loop
from art_rlvr.observe import tracing

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_CHARS = 4000

ToolStatus = Literal["ok", "error", "timeout", "invalid_arguments", "unknown_tool"]
ToolChoice = Literal["none", "auto", "required"] | str | dict[str, object]


@runtime_checkable
class DeclaredTool(Protocol):
    """A callable that brings its own name, description and JSON schema (an MCP server's tool,
    `scenarios.environments.mcp_tools.McpTool`), called with the model's arguments as keywords."""

    name: str
    description: str
    input_schema: dict[str, object]

    def __call__(self, **arguments: object) -> object: ...


class _AnyObject(BaseModel):
    """The arguments model of a `DeclaredTool`: any JSON object (its owner checks it)."""

    model_config = ConfigDict(extra="allow")


class Tool(BaseModel):
    """A function the model may call, with the schema it is shown and the limits it runs under.

    `arguments` is the pydantic model built from the signature; its fields are aliased to the
    parameter names so a parameter may be called `json` or `model_config` without clashing
    with pydantic's own attributes."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
    description: str = ""
    fn: Callable[..., object]
    arguments: type[BaseModel]
    positional: tuple[str, ...] = ()  # positional-only parameters, in order
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    max_chars: int = Field(default=DEFAULT_MAX_CHARS, ge=1)
    input_schema: dict[str, object] | None = None  # declared by the tool itself (`DeclaredTool`)

    @property
    def parameters(self) -> dict[str, object]:
        """The JSON schema of the arguments, without pydantic's generated titles (noise to a
        model reading the prompt)."""
        schema = (
            json.loads(json.dumps(self.input_schema))
            if self.input_schema is not None
            else self.arguments.model_json_schema(by_alias=True)
        )
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return schema

    @property
    def definition(self) -> dict[str, object]:
        """The entry for the request's `tools` list (and `Trajectory.tools`)."""
        function = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


def tool(
    fn: Callable[..., object],
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> Tool:
    """A `Tool` from a plain function (sync or async); `name` and `description` default to the
    function's name and its docstring without the Args/Returns sections. A `DeclaredTool`
    keeps its own name, description and schema."""
    if isinstance(fn, DeclaredTool):
        return Tool(
            name=name or fn.name,
            description=fn.description if description is None else description,
            fn=fn,
            arguments=_AnyObject,
            input_schema=fn.input_schema,
            timeout_s=timeout_s,
            max_chars=max_chars,
        )
    name = name or getattr(fn, "__name__", None)
    if not name:
        raise ValueError(f"{fn!r} has no __name__; pass name=...")
    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    described = {p.arg_name: " ".join((p.description or "").split()) for p in doc.params}
    signature = inspect.signature(fn, eval_str=True)
    fields: dict[str, Any] = {}  # pydantic field definitions, built at run time
    positional: list[str] = []
    for i, param in enumerate(signature.parameters.values()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ValueError(
                f"tool {name}: *{param.name} / **{param.name} cannot be described to a model; "
                "name every parameter"
            )
        if param.kind is param.POSITIONAL_ONLY:
            positional.append(param.name)
        annotation = Any if param.annotation is param.empty else param.annotation
        default = ... if param.default is param.empty else param.default
        fields[f"p{i}"] = (
            annotation,
            Field(default, alias=param.name, description=described.get(param.name) or None),
        )
    arguments = create_model(
        f"{name}_arguments",
        __config__=ConfigDict(extra="forbid", validate_by_alias=True, validate_by_name=False),
        **fields,
    )
    return Tool(
        name=name,
        description=description if description is not None else (doc.description or "").strip(),
        fn=fn,
        arguments=arguments,
        positional=tuple(positional),
        timeout_s=timeout_s,
        max_chars=max_chars,
    )


def as_tool(item: object, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Tool:
    """A `Tool` as it is, or one from a function that runs under `timeout_s`."""
    if isinstance(item, Tool):
        return item
    if not callable(item):
        raise TypeError(f"{item!r} is neither a function nor a Tool")
    return tool(item, timeout_s=timeout_s)


def as_tools(items: Iterable[object], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Tool]:
    """Tools by name from functions (run under `timeout_s`) or `Tool`s; two tools with one name
    are an error."""
    tools = [as_tool(item, timeout_s=timeout_s) for item in items]
    names = [t.name for t in tools]
    if duplicates := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"two tools share a name: {', '.join(duplicates)}")
    return {t.name: t for t in tools}


def tool_choice_param(choice: ToolChoice | None) -> str | dict[str, object] | None:
    """`tool_choice` as the API takes it: "none" / "auto" / "required", a tool's name (a named
    function choice), or a dict passed through."""
    if choice is None or isinstance(choice, dict) or choice in ("none", "auto", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


class ToolCallResult(BaseModel):
    """What one tool call did: `content` is what the model is shown, `error` the detail (a
    traceback) for the logs."""

    model_config = ConfigDict(frozen=True)

    tool_call_id: str
    name: str
    arguments: str  # as the model sent them
    status: ToolStatus
    content: str
    error: str | None = None
    truncated: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def message(self) -> dict[str, str]:
        """The `tool` message that answers the call."""
        return {"role": "tool", "tool_call_id": self.tool_call_id, "content": self.content}


def render(value: object) -> str:
    """A tool's return value as text for the model."""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    if isinstance(value, enum.Enum):
        return str(value.value)
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


class ArgumentError(ValueError):
    """Arguments the model sent that cannot be passed to the tool."""


def bind_arguments(tool: Tool, raw: str) -> tuple[list[object], dict[str, object]]:
    """Positional and keyword arguments for `tool` from the model's JSON string (an empty
    string is no arguments); raises `ArgumentError` with a message meant for the model."""
    if tool.input_schema is not None:
        return [], declared_arguments(tool, raw)
    try:
        validated = tool.arguments.model_validate_json(raw.strip() or "{}")
    except ValidationError as error:
        problems = error.errors(include_url=False)
        if problems and problems[0]["type"] == "json_invalid":
            raise ArgumentError(
                f"arguments for {tool.name} are not valid JSON ({problems[0]['msg']}); "
                f"send a JSON object matching its parameters"
            ) from error
        if problems and problems[0]["type"] == "model_type":
            raise ArgumentError(f"arguments for {tool.name} must be a JSON object") from error
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(arguments)'}: {e['msg']}" for e in problems
        )
        raise ArgumentError(f"arguments for {tool.name} do not match its schema: {detail}") from (
            error
        )
    values = {
        field.alias or key: getattr(validated, key)
        for key, field in type(validated).model_fields.items()
    }
    args = [values.pop(name) for name in tool.positional]
    return args, values


def declared_arguments(tool: Tool, raw: str) -> dict[str, object]:
    """A `DeclaredTool`'s keyword arguments: the model's JSON object as it is."""
    try:
        value = json.loads(raw.strip() or "{}")
    except json.JSONDecodeError as error:
        raise ArgumentError(
            f"arguments for {tool.name} are not valid JSON ({error.msg}); "
            "send a JSON object matching its parameters"
        ) from None
    if not isinstance(value, dict):
        raise ArgumentError(f"arguments for {tool.name} must be a JSON object")
    return value


def _call_inputs(inputs: Mapping[str, object]) -> dict[str, object]:
    call = inputs.get("call")
    function = getattr(call, "function", None)
    return {
        "id": getattr(call, "id", None),
        "name": getattr(function, "name", None),
        "arguments": getattr(function, "arguments", None),
    }


def _call_output(result: ToolCallResult) -> dict[str, object]:
    return result.model_dump(exclude={"tool_call_id", "arguments"})


class _CallId(TypedDict):
    """What every result of one call repeats: which call, which tool, the raw arguments."""

    tool_call_id: str
    name: str
    arguments: str


@tracing.op("art_rlvr.tool", inputs=_call_inputs, output=_call_output)
async def call_tool(tools: Mapping[str, Tool], call: object) -> ToolCallResult:
    """Run one tool call from a model's message (an OpenAI SDK tool call, or anything with
    `.id` and `.function.name/.arguments`); every failure is a result, not an exception."""
    function = getattr(call, "function", None)
    name = str(getattr(function, "name", "") or "")
    raw = getattr(function, "arguments", "")
    raw = raw if isinstance(raw, str) else json.dumps(raw)
    base: _CallId = {
        "tool_call_id": str(getattr(call, "id", "") or ""),
        "name": name,
        "arguments": raw,
    }
    found = tools.get(name)
    if found is None:
        available = ", ".join(tools) or "none"
        what = (
            f"unknown tool {name!r}"
            if function
            else f"unsupported tool call ({type(call).__name__})"
        )
        content = f"Error: {what}; available tools: {available}"
        return ToolCallResult(**base, status="unknown_tool", content=content, error=content)
    try:
        args, kwargs = bind_arguments(found, raw)
    except ArgumentError as error:
        content, _ = cap(f"Error: {error}", found.max_chars)
        return ToolCallResult(**base, status="invalid_arguments", content=content, error=content)
    started = time.monotonic()
    try:
        text = await guarded(
            found.fn, args, kwargs, timeout_s=found.timeout_s, what=name, then=render
        )
    except CallbackError as error:
        content, _ = cap(f"Error: {error}", found.max_chars)
        return ToolCallResult(
            **base,
            status="timeout" if error.timed_out else "error",
            content=content,
            error=error.detail,
            seconds=time.monotonic() - started,
        )
    content, truncated = cap(text, found.max_chars)
    return ToolCallResult(
        **base,
        status="ok",
        content=content,
        truncated=truncated,
        seconds=time.monotonic() - started,
    )


__all__ = [
    "DEFAULT_MAX_CHARS",
    "DEFAULT_TIMEOUT_S",
    "ArgumentError",
    "CallbackError",
    "DeclaredTool",
    "Tool",
    "ToolCallResult",
    "ToolChoice",
    "ToolStatus",
    "as_tools",
    "bind_arguments",
    "call_tool",
    "cap",
    "declared_arguments",
    "guarded",
    "off_loop",
    "render",
    "tool",
    "tool_choice_param",
]
