"""The shapes a chat request's messages and `chat_template_kwargs` must have, checked at the
HTTP edge so that hostile or malformed input is a 400 that names the field, never a crash deep
in rendering (a 500).

Messages stay plain dicts for the rest of the server (extra keys are kept, as vLLM keeps them);
only the keys the renderer reads are typed. `chat_template_kwargs` are template variables: a
per-request template (`chat_template`) is refused, as vLLM refuses it unless started with
`--trust-request-chat-template`, and so are the keywords the server itself passes to
`apply_chat_template` (a request must not switch tokenisation, truncation or the tools off).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = ["Message", "TemplateKwargs", "check_message", "check_template_kwargs"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class Function(_Open):
    name: str
    arguments: str | dict[str, object] = "{}"


class ToolCall(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: Function


class ChatMessage(_Open):
    role: str = Field(min_length=1)
    content: object = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _text(cls, content: object) -> object:
        if content is None or isinstance(content, str):
            return content
        if not isinstance(content, list):
            raise ValueError("must be a string, a list of text parts or null")
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ValueError(f"part {i}: only text parts are read (the model reads no media)")
            if not isinstance(part.get("text"), str):
                raise ValueError(f"part {i}: a text part needs a string `text`")
        return content


def check_message(message: dict[str, object]) -> dict[str, object]:
    """`message` unchanged if the renderer can read it, else a ValueError naming the key."""
    try:
        parsed = ChatMessage.model_validate(message)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{where}: {first['msg'].removeprefix('Value error, ')}") from None
    if parsed.role == "tool" and parsed.content is None:
        raise ValueError("content: a tool message needs content (the tool's result)")
    return message


Message = Annotated[dict[str, object], AfterValidator(check_message)]

# apply_chat_template's own keywords, which the server sets: a request may not override them
RESERVED = frozenset(
    {
        "add_generation_prompt",
        "continue_final_message",
        "conversation",
        "documents",
        "max_length",
        "messages",
        "padding",
        "return_assistant_tokens_mask",
        "return_dict",
        "return_tensors",
        "tokenize",
        "tokenizer_kwargs",
        "tools",
        "truncation",
    }
)


def check_template_kwargs(kwargs: dict[str, object] | None) -> dict[str, object] | None:
    """Template variables only: no per-request template, none of the server's own keywords."""
    for key in kwargs or {}:
        if key in ("chat_template", "chat_template_path"):
            raise ValueError(
                f"{key}: per-request chat templates are not accepted (as vLLM without "
                "--trust-request-chat-template); set the model's template when it is registered"
            )
        if key in RESERVED:
            raise ValueError(f"{key}: set by the server, not a template variable")
        if not key.isidentifier():
            raise ValueError(f"{key!r}: not a template variable name")
    return kwargs


TemplateKwargs = Annotated[dict[str, object] | None, AfterValidator(check_template_kwargs)]
