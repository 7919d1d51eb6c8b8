"""The chat-completions request TorchBackend's server honours, as data: its OpenAI fields, the
extras ART's `model.openai_client()` sends, and the rules that decide the engine's sampling
(vLLM's defaults for `tool_choice`; a grammar for a forced tool call or a JSON reply). Unknown
fields are ignored, as vLLM does; incoherent ones are a 400 before anything is generated.

A forced tool call and a `response_format` may come together (the OpenAI Agents SDK sends both
for an agent with tools and a typed output): as on OpenAI and vLLM, the forced call's grammar
applies to the turn that forces it, the response format to turns that force no call.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from art_rlvr.backend.engine.constrained import json_grammar, tool_call_grammar
from art_rlvr.backend.engine.generation import SamplingParams
from art_rlvr.backend.serving.request_shapes import Message, TemplateKwargs

MAX_REQUEST_BYTES = 4 * 1024 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class FunctionSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    description: str | None = None
    parameters: dict[str, object] | None = None
    strict: bool | None = None


class ToolSpec(_Strict):
    type: Literal["function"] = "function"
    function: FunctionSpec


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: FunctionName


class JsonSchemaSpec(_Strict):
    name: str = "response"
    schema_: dict[str, object] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatRequest(BaseModel):
    """The subset of the chat-completions request we honour; unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[Message] = Field(min_length=1)
    n: int = Field(default=1, ge=1, le=128)
    temperature: float | None = Field(default=None, ge=0.0, le=10.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    chat_template_kwargs: TemplateKwargs = None

    @model_validator(mode="after")
    def _coherent(self) -> ChatRequest:
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) < len(names):
            raise ValueError(f"tools: function names must be unique, got {names}")
        if self.tool_choice not in (None, "none") and not self.tools:
            raise ValueError("tool_choice: only allowed when tools are given")
        named = self.tool_choice
        if isinstance(named, NamedToolChoice) and named.function.name not in names:
            raise ValueError(
                f"tool_choice: function {named.function.name!r} is not among the tools {names}"
            )
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is None:
            raise ValueError("response_format: type json_schema needs a json_schema object")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: only allowed when logprobs is true")
        return self

    @property
    def choice(self) -> str | NamedToolChoice:
        """vLLM's defaults: `auto` when tools are given, `none` without."""
        if self.tool_choice is None:
            return "auto" if self.tools else "none"
        return self.tool_choice

    @property
    def forces_tool_call(self) -> bool:
        return self.choice == "required" or isinstance(self.choice, NamedToolChoice)

    @property
    def parses_tool_calls(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    def tool_dicts(self) -> list[dict[str, object]] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def grammar(self) -> str | None:
        """The constraint on the reply: a forced tool call, else a JSON response format."""
        tools = self.tool_dicts() or []
        if isinstance(self.choice, NamedToolChoice):
            name = self.choice.function.name
            named = [
                t.model_dump(exclude_none=True) for t in self.tools or [] if t.function.name == name
            ]
            return tool_call_grammar(named, parallel=False)
        if self.choice == "required":
            return tool_call_grammar(tools, parallel=self.parallel_tool_calls)
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return json_grammar({"type": "object"})
        assert fmt.json_schema is not None
        return json_grammar(fmt.json_schema.schema_ or True)

    def sampling(self, default_max_tokens: int) -> SamplingParams:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=self.max_completion_tokens or self.max_tokens or default_max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            stop=tuple(s for s in stops if s),
            seed=self.seed,
            ignore_eos=self.ignore_eos,
            grammar=self.grammar(),
            top_logprobs=(self.top_logprobs or 0) if self.logprobs else 0,
        )
