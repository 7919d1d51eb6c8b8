"""Agents built with the ecosystem's own tools train on TorchBackend, on exactly what was sampled.

ART's LangGraph integration and the OpenAI Agents SDK, for real, against the real server: each
agent's own trajectories train one RL step, and every trained turn's prompt and completion ids
equal the ids the server sampled for it. Neither client keeps ids, so the ground truth comes
from the HTTP responses themselves (the test asks the server for `return_token_ids`, a field
the clients drop), never from the server's record the trainer reads.

The two rollout functions below are the examples of docs/agents.md, verbatim
(`tests/test_docs.py` checks it).
"""

# The examples carry their own imports, so that they read whole in the docs.
# ruff: noqa: E402

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import art
import httpx
import pytest
from openai import AsyncOpenAI
from openai.types.chat.chat_completion import Choice

from art_rlvr.backend.training import train as T

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# --8<-- [start:langgraph]
from art.langgraph import init_chat_model, wrap_rollout
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


async def langgraph_rollout(model: art.Model, a: int, b: int, **chat: Any) -> art.Trajectory:
    """A ReAct agent whose first turn must call `multiply`; `chat` goes to LangChain's
    ChatOpenAI (the endpoint and key come from ART's `wrap_rollout`)."""
    first = {"tool_choice": {"type": "function", "function": {"name": "multiply"}}}
    forced = init_chat_model(model.get_inference_name(), model_kwargs=first, **chat)
    free = init_chat_model(model.get_inference_name(), **chat)
    agent = create_react_agent(
        lambda state, runtime: (
            free if any(m.type == "tool" for m in state["messages"]) else forced
        ).bind_tools([multiply]),
        tools=[multiply],
        prompt="Use the multiply tool, then answer with the number.",
    )
    state = await agent.ainvoke(
        {"messages": [("user", f"What is {a} times {b}?")]}, {"recursion_limit": 6}
    )
    answer = state["messages"][-1].content
    return art.Trajectory(messages_and_choices=[], reward=float(str(a * b) in answer))


# ART's integration records every model call and fills the trajectory's messages:
#   groups = [art.TrajectoryGroup(wrap_rollout(model, langgraph_rollout)(model, 3, 4)
#                                 for _ in range(4))]
#   await backend.train(model, groups)
# --8<-- [end:langgraph]

# --8<-- [start:agents]
from agents import (
    Agent,
    AgentsException,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from pydantic import BaseModel

set_tracing_disabled(True)  # no trace export to OpenAI's servers


class Product(BaseModel):
    value: int


@function_tool
def times(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


async def agents_sdk_rollout(
    model: art.Model, a: int, b: int, client: AsyncOpenAI, **settings: Any
) -> art.Trajectory:
    """An agent with a function tool it must call and a typed output."""
    agent = Agent(
        name="calculator",
        instructions="Call the times tool, then give the product.",
        tools=[times],
        output_type=Product,
        model=OpenAIChatCompletionsModel(model=model.get_inference_name(), openai_client=client),
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, max_tokens=64, **settings
        ),
    )
    trajectory = art.Trajectory(reward=0.0)
    with trajectory:  # ART records every request to the model as the trajectory's `exchanges`
        try:
            result = await Runner.run(agent, f"What is {a} times {b}?", max_turns=4)
        except AgentsException as error:  # e.g. an answer cut by max_tokens: no valid JSON
            trajectory.log(f"agent failed: {error}")  # the sampled turns still train
            return trajectory
    trajectory.reward = float(result.final_output.value == a * b)
    return trajectory


# client = AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key)
# groups = [art.TrajectoryGroup([await agents_sdk_rollout(model, 3, 4, client) for _ in range(4)])]
# await backend.train(model, groups)
# --8<-- [end:agents]

PAIRS = [(3, 4), (6, 7), (2, 9), (5, 8)]  # two groups of two


class Tap:
    """The server's own answers, read off the wire: response id -> [(prompt ids, ids)]."""

    def __init__(self) -> None:
        self.served: dict[str, list[tuple[list[int], list[int]]]] = {}

    async def __call__(self, response: httpx.Response) -> None:
        await response.aread()
        body = json.loads(response.content)
        self.served[body["id"]] = [
            (body["prompt_token_ids"], choice["token_ids"]) for choice in body["choices"]
        ]

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(event_hooks={"response": [self]}, timeout=600)

    def pairs(self) -> list[tuple[list[int], list[int]]]:
        return [pair for pairs in self.served.values() for pair in pairs]


def trained_turns(trajectories, tokenizer, policy) -> list[T.Turn | None]:
    return [
        turn
        for t in trajectories
        for turn in (
            T.exchange_turns(t, tokenizer, policy)
            if t.exchanges
            else [
                turn
                for items, tools in T.histories(t)
                for _, turn in T.history_turns(items, tools, tokenizer, policy)
            ]
        )
    ]


def two_groups(trajectories: list[art.Trajectory]) -> list[art.TrajectoryGroup]:
    """Rewards spread within each group so that every group carries signal."""
    half = len(trajectories) // 2
    groups = [trajectories[:half], trajectories[half:]]
    for group in groups:
        for i, t in enumerate(group):
            t.reward = float(i % 2)
    return [art.TrajectoryGroup(g) for g in groups]


async def test_langgraph_agent_trains_on_exactly_the_served_ids(backend, make_model) -> None:
    model = await make_model("lg")
    tap = Tap()
    chat = {
        "max_tokens": 64,  # a whole call is 36-40 tokens
        "http_async_client": tap.client(),
        "extra_body": {"return_token_ids": True},  # for the tap; LangChain drops them
    }
    rollout = wrap_rollout(model, langgraph_rollout)
    trajectories = list(await asyncio.gather(*(rollout(model, a, b, **chat) for a, b in PAIRS)))
    choices = [
        item
        for t in trajectories
        for items, _ in T.histories(t)
        for item in items
        if isinstance(item, Choice)
    ]
    assert all("token_ids" not in (c.model_extra or {}) for c in choices)  # LangChain's loss
    assert any(c.message.tool_calls for c in choices)  # the forced first turn
    trainee = backend._trainees[model.name]
    policy = T.TurnPolicy(served=trainee.served, model=model.get_inference_name())
    turns = trained_turns(trajectories, trainee.tokenizer, policy)
    assert len(turns) == len(choices) == len(tap.pairs())
    assert sorted((t.prompt_ids, t.completion_ids) for t in turns) == sorted(tap.pairs())
    assert {t.source for t in turns} == {"recovered"}

    result = await backend.train(model, two_groups(trajectories), learning_rate=1e-4)
    m = result.metrics
    assert (m["turns_recovered"], m["turns_rerendered"], m["turns_skipped"]) == (len(turns), 0, 0)
    assert result.step == 1 and model.get_inference_name() == f"{model.name}@1"


@pytest.mark.parametrize(
    "ids_from",
    [pytest.param("record", marks=pytest.mark.slow), "response"],  # record: 81 s
)
async def test_agents_sdk_typed_output_with_required_tool_trains_served_ids(
    backend, make_model, ids_from
) -> None:
    """`output_type` plus `tool_choice="required"`: the first request forces the tool (with a
    response format beside it), the next answers in the schema. Trained through ART's capture;
    with a plain client the ids come from the server's record, with ART's client (which asks for
    them) from the responses."""
    model = await make_model("sdk")
    tap = Tap()
    if ids_from == "record":
        client = AsyncOpenAI(
            base_url=model.inference_base_url,
            api_key=model.inference_api_key,
            http_client=tap.client(),
        )
        settings: dict[str, Any] = {"extra_body": {"return_token_ids": True}}
    else:
        client, settings = model.openai_client(), {}
    trajectories = list(
        await asyncio.gather(
            *(agents_sdk_rollout(model, a, b, client, **settings) for a, b in PAIRS)
        )
    )
    requests = [e.request for t in trajectories for e in t.exchanges.chat_completions]
    assert requests[0]["tool_choice"] == "required" and "response_format" in requests[0]
    if ids_from == "record":  # the trainer must not see what only the tap asked for
        trajectories = [without_ids(t) for t in trajectories]
    trainee = backend._trainees[model.name]
    policy = T.TurnPolicy(served=trainee.served, model=model.get_inference_name())
    turns = trained_turns(trajectories, trainee.tokenizer, policy)
    assert len(turns) == len(requests) >= 2 * len(trajectories)  # a call, then the answer
    if ids_from == "record":
        assert sorted((t.prompt_ids, t.completion_ids) for t in turns) == sorted(tap.pairs())
    expected = "recovered" if ids_from == "record" else "served"
    assert {t.source for t in turns} == {expected}

    result = await backend.train(model, two_groups(trajectories), learning_rate=1e-4)
    assert result.metrics[f"turns_{expected}"] == len(turns)
    assert result.metrics["turns_rerendered"] == 0 and result.step == 1


def without_ids(trajectory: art.Trajectory) -> art.Trajectory:
    """The trajectory as a client that never asked for ids would have captured it."""
    exchanges = []
    for exchange in trajectory.exchanges.chat_completions:
        body = exchange.response.model_dump()
        body.pop("prompt_token_ids", None)
        for choice in body["choices"]:
            choice.pop("token_ids", None)
        exchanges.append(
            exchange.model_copy(update={"response": type(exchange.response).model_validate(body)})
        )
    patched = trajectory.exchanges.model_copy(update={"chat_completions": exchanges})
    return trajectory.model_copy(update={"exchanges": patched})


def test_docs_show_these_examples_verbatim() -> None:
    """docs/agents.md's two examples are the code above, so they cannot go stale."""
    here = Path(__file__).read_text()
    docs = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text()
    shown = re.findall(r"```python\n(.*?)```", docs, re.DOTALL)
    for name in ("langgraph", "agents"):
        example = re.search(
            rf"# --8<-- \[start:{name}\]\n(.*?)# --8<-- \[end:{name}\]", here, re.DOTALL
        )
        assert example and example.group(1) in shown, f"docs/agents.md lacks the {name} example"
