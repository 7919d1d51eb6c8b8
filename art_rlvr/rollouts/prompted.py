"""A system prompt into an unchanged `(model, record)` rollout function's requests.

ART's rollout functions send their own system message and take no context, so GEPA's
candidate (or EI's hinted prompt, or the scenario's `system_prompt`) reaches them through the
one thing they all use: the client `model.openai_client()` returns. The function is handed a
copy of its model whose client sends through `PromptingClient`, an httpx client that puts the
prompt into every chat completions request before it leaves: the first message's content is
replaced when that message is a system message, else a system message is inserted first.
ART's capture scope records the request as sent (it wraps httpx's `send`, which ours calls
after rewriting), and `as_sent` rewrites the function's own `messages_and_choices` the same way,
so the trajectory, the reflector's view and the trained prompt are what the server received.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import art
import httpx
import openai

from art_rlvr.core.outcome import art_message, is_sampled

if TYPE_CHECKING:
    from art.types import Message

How = Literal["replaced", "inserted"]
PROMPTING = (
    "the run's system prompt goes out as the system message of each chat completions request "
    "it sends through model.openai_client(): the first message's content is replaced when it "
    "is a system message, else a system message is inserted first (each trajectory's "
    "`system_prompt_sent` says which)"
)


def with_system[M](messages: Sequence[M], prompt: str) -> tuple[list[M | Message], How]:
    """`messages` with `prompt` as the system message: the first message's content replaced
    when it is a system message, else a system message inserted before it."""
    first = messages[0] if messages else None
    if isinstance(first, Mapping) and first.get("role") == "system":
        return [art_message({**first, "content": prompt}), *messages[1:]], "replaced"
    return [art_message({"role": "system", "content": prompt}), *messages], "inserted"


def chat_body(request: httpx.Request) -> dict[str, Any] | None:
    """The JSON body of a chat completions request with a list of messages, else None."""
    if request.method != "POST" or not request.url.path.endswith("/chat/completions"):
        return None
    try:
        body = json.loads(request.content)
    except (httpx.RequestNotRead, ValueError):
        return None
    return body if isinstance(body, dict) and isinstance(body.get("messages"), list) else None


class PromptingClient(openai.DefaultAsyncHttpxClient):
    """An httpx client (the OpenAI SDK's defaults) that sends `prompt` as the system message of
    every chat completions request, and keeps how each request was changed (`sent`)."""

    def __init__(self, prompt: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.prompt = prompt
        self.sent: list[How] = []

    async def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        body = chat_body(request)
        if body is not None:
            messages, how = with_system(body["messages"], self.prompt)
            self.sent.append(how)
            headers = [(k, v) for k, v in request.headers.multi_items() if k != "content-length"]
            request = httpx.Request(
                request.method,
                request.url,
                headers=headers,
                content=json.dumps({**body, "messages": messages}).encode(),
                extensions=request.extensions,
            )
        return await super().send(request, **kwargs)


def prompted_model(model: art.Model, client: PromptingClient) -> art.Model:
    """A copy of `model` whose `openai_client()` is ART's own client over `client` (its extra
    body, cost records and options kept); `model` itself unchanged. A model that cannot make
    a client is returned as it is: the function cannot send anything through it either."""
    try:
        own = model.openai_client()
    except ValueError:
        return model
    view = model.model_copy()
    view._openai_client = own.with_options(http_client=client)
    return view


def as_sent(trajectory: art.Trajectory, prompt: str) -> art.Trajectory:
    """The function's trajectory with its kept histories rewritten as its requests were (the
    system message that went out), so it records, trains on and shows what was sent."""
    if trajectory.messages_and_choices:
        trajectory.messages_and_choices = with_system(trajectory.messages_and_choices, prompt)[0]
    for history in trajectory.additional_histories:
        if history.messages_and_choices:
            history.messages_and_choices = with_system(history.messages_and_choices, prompt)[0]
    return trajectory


def carries(messages: Sequence[object], prompt: str) -> bool:
    """Whether a request's messages open with `prompt` as their system message."""
    first = messages[0] if messages else None
    return (
        isinstance(first, Mapping)
        and first.get("role") == "system"
        and (first.get("content") == prompt)
    )


def sent_problem(
    trajectory: art.Trajectory, scope: art.Trajectory, client: PromptingClient
) -> str | None:
    """Why the prompt did not reach the function's requests, or None: a request the capture
    saw without it (a client of the function's own, not `model.openai_client()`'s), or turns
    sampled while nothing went through the prompting client."""
    captured = (trajectory.exchanges or scope.exchanges).chat_completions
    missed = sum(not carries(e.request.get("messages") or [], client.prompt) for e in captured)
    sampled = any(map(is_sampled, trajectory.messages_and_choices))
    unseen = sampled and not captured and not client.sent
    if not missed and not unseen:
        return None
    return (
        f"the system prompt did not reach {missed or 'its'} request(s): a function that takes "
        "(model, record) receives it only through model.openai_client() (add a third "
        "parameter `context` and send `context.system_prompt` to use a client of its own)"
    )


def sent_summary(client: PromptingClient) -> str:
    """How the requests were changed, for the trajectory's metadata (`system_prompt_sent`)."""
    counts = {how: client.sent.count(how) for how in dict.fromkeys(client.sent)}
    return ", ".join(f"{how} in {n}" for how, n in counts.items()) or "no request"


__all__ = [
    "PROMPTING",
    "PromptingClient",
    "as_sent",
    "prompted_model",
    "sent_problem",
    "sent_summary",
    "with_system",
]
