"""The one rollout loop (`rollouts.loop.run_episode`): episodes with tools against a scripted OpenAI-compatible server on loopback: what the model
is sent, what the trajectory keeps, and a defined outcome for every kind of bad input."""

from __future__ import annotations

import asyncio
import enum
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypedDict

import art
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall as ToolCall
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message_function_tool_call import Function
from pydantic import BaseModel

from art_rlvr.core.outcome import feedback_of
from art_rlvr.core.types import Episode, Messages, Reply, Score
from art_rlvr.rollouts.loop import run_episode
from art_rlvr.rollouts.sampling import SamplingConfig, rollout_seed
from art_rlvr.rollouts.tools import as_tools, call_tool, tool
from art_rlvr.testing import ScriptedServer, Step, scripted_model
from art_rlvr.testing.trace_server import RecordingTraceServer

SYSTEM = {"role": "system", "content": "You may use tools."}
USER = {"role": "user", "content": "What is 2 + 3, and the weather in Paris?"}


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


async def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def explode() -> str:
    raise ValueError("boom")


def huge() -> str:
    return "x" * 2_000_000


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Hung tools wait on this; set at teardown so no thread outlives the test for long."""
    event = threading.Event()
    yield event
    event.set()


def kinds(trajectory: art.Trajectory) -> list[str]:
    return [
        "choice" if isinstance(m, Choice) else m["role"] for m in trajectory.messages_and_choices
    ]


async def test_multi_turn_tool_episode_is_one_trajectory() -> None:
    script = [
        Step.calls(("add", {"a": 2, "b": 3}), ("weather", {"city": "Paris"})),
        Step.calls(("add", {"a": 5, "b": 1}), text="Checking."),
        Step.reply("6, and sunny."),
    ]
    with ScriptedServer(script) as server:
        t = await run_episode(
            scripted_model(server), Episode([SYSTEM, USER], tools=(add, weather)),
            sampling=SamplingConfig(max_tokens=32, seed=3),
        )  # fmt: skip
        requests = server.chat_requests
    assert kinds(t) == [
        "system", "user", "choice", "tool", "tool", "choice", "tool", "choice",
    ]  # fmt: skip
    first, second, last = (m for m in t.messages_and_choices if isinstance(m, Choice))
    tool_messages = [m for m in t.messages_and_choices if isinstance(m, dict)][2:]
    calls = [*first.message.tool_calls, *second.message.tool_calls]
    assert [m["tool_call_id"] for m in tool_messages] == [c.id for c in calls]
    assert [m["content"] for m in tool_messages] == ["5", "sunny in Paris", "6"]
    assert last.message.content == "6, and sunny."
    schemas = [tool(add).definition, tool(weather).definition]
    assert t.tools == schemas
    assert t.reward == 0.0
    assert {k: t.metrics[k] for k in ("turns", "tool_calls", "tool_errors", "turn_cap_hit")} == {
        "turns": 3.0, "tool_calls": 3.0, "tool_errors": 0.0, "turn_cap_hit": 0.0,
    }  # fmt: skip
    # what the OpenAI SDK put on the wire, turn by turn
    assert len(requests) == 3
    assert all(r.body["tools"] == schemas and r.body["logprobs"] is True for r in requests)
    assert [r.body["seed"] for r in requests] == [3, rollout_seed(3, "turn", 1), rollout_seed(3, "turn", 2)]  # fmt: skip
    assert requests[0].messages == [SYSTEM, USER]
    assert requests[1].messages == [
        SYSTEM,
        USER,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": calls[0].id,
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                },
                {
                    "id": calls[1].id,
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": calls[0].id, "content": "5"},
        {"role": "tool", "tool_call_id": calls[1].id, "content": "sunny in Paris"},
    ]
    assert requests[2].messages[5]["content"] == "Checking."
    assert requests[2].messages[6] == {"role": "tool", "tool_call_id": calls[2].id, "content": "6"}


def failing_tools(release: threading.Event) -> list[Any]:
    def hang() -> str:
        release.wait(30)
        return "too late"

    async def ahang() -> str:
        await asyncio.sleep(30)
        return "too late"

    return [
        add,
        explode,
        tool(hang, timeout_s=0.2),
        tool(ahang, timeout_s=0.2),
        tool(huge, max_chars=1000),
    ]


@pytest.mark.parametrize(
    ("name", "arguments", "status", "seen", "counts"),
    [
        ("explode", "{}", "error", "Error: explode raised ValueError: boom", {}),
        ("hang", "{}", "timeout", "Error: hang timed out after 0.2 s", {"tool_timeouts": 1}),
        ("ahang", "{}", "timeout", "Error: ahang timed out after 0.2 s", {"tool_timeouts": 1}),
        (
            "add",
            '{"a": 1',
            "invalid_arguments",
            "Error: arguments for add are not valid JSON",
            {"tool_invalid_arguments": 1},
        ),
        (
            "add",
            "[1, 2]",
            "invalid_arguments",
            "Error: arguments for add must be a JSON object",
            {"tool_invalid_arguments": 1},
        ),
        (
            "add",
            '{"a": "x", "b": 2}',
            "invalid_arguments",
            "Error: arguments for add do not match its schema: a: Input should be a valid integer",
            {"tool_invalid_arguments": 1},
        ),
        (
            "add",
            '{"a": 1}',
            "invalid_arguments",
            "do not match its schema: b: Field required",
            {"tool_invalid_arguments": 1},
        ),
        (
            "add",
            '{"a": 1, "b": 2, "c": 3}',
            "invalid_arguments",
            "c: Extra inputs are not permitted",
            {"tool_invalid_arguments": 1},
        ),
        (
            "nope",
            "{}",
            "unknown_tool",
            "Error: unknown tool 'nope'; available tools: add, explode, hang, ahang, huge",
            {"tool_unknown": 1},
        ),
    ],
)
async def test_a_failing_call_is_a_message_the_model_sees(
    release, name, arguments, status, seen, counts
) -> None:
    """Each failure is answered with a `tool` message, counted, logged, and the episode goes on
    to the model's next turn."""
    script = [Step.calls((name, arguments)), Step.reply("Sorry.")]
    with ScriptedServer(script) as server:
        started = time.monotonic()
        t = await run_episode(
            scripted_model(server), Episode([USER], tools=tuple(failing_tools(release)))
        )
        elapsed = time.monotonic() - started
        requests = server.chat_requests
    assert kinds(t) == ["user", "choice", "tool", "choice"]
    answer = t.messages_and_choices[2]
    assert seen in answer["content"]
    assert answer["tool_call_id"] == t.messages_and_choices[1].message.tool_calls[0].id
    assert requests[1].messages[-1] == answer  # the model was shown the error
    expected = {"tool_timeouts": 0, "tool_invalid_arguments": 0, "tool_unknown": 0, **counts}
    assert {k: t.metrics[k] for k in expected} == expected
    assert (t.metrics["turns"], t.metrics["tool_calls"], t.metrics["tool_errors"]) == (2, 1, 1)
    assert any(f"tool {name}" in line and status in line for line in t.logs)
    assert elapsed < 5  # a hung tool is not waited for


async def test_traceback_of_a_raising_tool_is_kept_in_logs() -> None:
    with ScriptedServer([Step.calls(("explode", "{}")), Step.reply("ok")]) as server:
        t = await run_episode(scripted_model(server), Episode([USER], tools=(explode,)))
    assert any("Traceback" in line and 'raise ValueError("boom")' in line for line in t.logs)


async def test_huge_output_is_truncated_with_a_note() -> None:
    with ScriptedServer([Step.calls(("huge", "{}")), Step.reply("ok")]) as server:
        t = await run_episode(
            scripted_model(server), Episode([USER], tools=(tool(huge, max_chars=1000),))
        )
        sent = server.chat_requests[1].messages[-1]["content"]
    content = t.messages_and_choices[2]["content"]
    assert content == sent
    assert content.startswith("x" * 1000) and not content.startswith("x" * 1001)
    assert content.endswith("[truncated: 1999000 of 2000000 characters not shown]")
    assert (t.metrics["tool_errors"], t.metrics["tool_truncated"]) == (0, 1)


async def test_hung_sync_tools_do_not_hold_up_later_calls(release) -> None:
    """Each sync tool runs in a thread of its own: many abandoned hung calls (more than a
    default thread pool has workers, min(32, cores + 4)) do not delay the next healthy call.
    With `run_in_executor(None, ...)` instead, the healthy call times out."""

    def hang() -> str:
        release.wait(30)
        return "late"

    tools = as_tools([tool(hang, timeout_s=0.1), tool(add, timeout_s=1.0)])

    def call(name: str, arguments: str) -> ToolCall:
        return ToolCall(
            id="call_1", type="function", function=Function(name=name, arguments=arguments)
        )

    hung = await asyncio.gather(*(call_tool(tools, call("hang", "{}")) for _ in range(40)))
    assert {r.status for r in hung} == {"timeout"}
    healthy = await call_tool(tools, call("add", '{"a": 1, "b": 2}'))
    assert (healthy.status, healthy.content) == ("ok", "3")


async def test_turn_cap_ends_a_model_that_never_stops_calling() -> None:
    with ScriptedServer([], default=Step.calls(("add", {"a": 1, "b": 1}))) as server:
        t = await run_episode(scripted_model(server), Episode([USER], tools=(add,), max_turns=3))
        assert len(server.chat_requests) == 3
    assert kinds(t) == ["user", "choice", "tool", "choice", "tool", "choice", "tool"]
    assert (t.metrics["turns"], t.metrics["tool_calls"], t.metrics["turn_cap_hit"]) == (3, 3, 1)
    assert any("turn cap" in line for line in t.logs)


async def test_no_tools_is_a_single_turn_rollout() -> None:
    """A single-turn episode sends one request and counts only its tokens and whether the
    reply was cut: no turns or tools to count (a single-reply rollout's metrics)."""
    with ScriptedServer([Step.reply("5")]) as server:
        t = await run_episode(
            scripted_model(server), Episode([USER]), sampling=SamplingConfig(seed=11)
        )
        body = server.chat_requests[0].body
    assert kinds(t) == ["user", "choice"] and t.tools is None
    assert "tools" not in body and "tool_choice" not in body and body["seed"] == 11
    assert set(t.metrics) == {"completion_tokens", "truncated"} and t.metrics["truncated"] == 0


@pytest.mark.parametrize(
    ("reset", "expected"),
    [
        (True, [{"type": "function", "function": {"name": "add"}}, None]),
        (False, [{"type": "function", "function": {"name": "add"}}] * 2),
    ],
)
async def test_named_tool_choice_then_reset(reset, expected) -> None:
    script = [Step.calls(("add", {"a": 1, "b": 2})), Step.reply("3")]
    with ScriptedServer(script) as server:
        await run_episode(
            scripted_model(server),
            Episode([USER], tools=(add, weather), tool_choice="add", reset_tool_choice=reset),
        )
        sent = [r.body.get("tool_choice") for r in server.chat_requests]
    assert sent == expected


class Guess:
    """A number-guessing environment: says higher / lower until the guess is right."""

    def __init__(self, secret: int) -> None:
        self.secret = secret
        self.seen: list[int] = []

    def __call__(self, messages: Messages) -> Reply:
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        index, text = len(replies) - 1, replies[-1]
        self.seen.append(index)
        guess = int(text) if text.strip().isdigit() else None
        if guess is None:
            return Reply(
                messages=({"role": "user", "content": "Answer with a number."},),
                metrics={"illegal_moves": 1},
            )
        if guess == self.secret:
            return Reply(done=True, log=f"solved in {index + 1}")
        hint = "higher" if guess < self.secret else "lower"
        return Reply(messages=({"role": "user", "content": hint},))


async def test_environment_drives_the_episode_and_score_sets_reward() -> None:
    env = Guess(62)
    script = [Step.reply("50"), Step.reply("a guess"), Step.reply("75"), Step.reply("62")]

    async def score(messages: Messages) -> Score:
        turns = sum(m["role"] == "assistant" for m in messages)
        return Score(reward=1 / turns, metrics={"won": 1.0}, feedback="won")

    with ScriptedServer(script) as server:
        t = await run_episode(scripted_model(server), Episode([USER], respond=env, reward=score))
        last_sent = server.chat_requests[-1].messages
    assert env.seen == [0, 1, 2, 3]
    assert kinds(t) == ["user", "choice", "user", "choice", "user", "choice", "user", "choice"]
    assert [m["content"] for m in last_sent if m["role"] == "user"][1:] == [
        "higher", "Answer with a number.", "lower",
    ]  # fmt: skip
    assert t.reward == 0.25
    m = t.metrics
    assert (m["turns"], m["illegal_moves"], m["won"], m["env_error"], m["reward_error"]) == (
        4, 1, 1, 0, 0,
    )  # fmt: skip
    assert "turn 3: solved in 4" in t.logs and feedback_of(t) == "won" and "won" not in t.logs


def raising_env(messages: Messages) -> Reply:
    raise KeyError("board")


def wrong_type_env(messages: Messages) -> int:
    return 3


@pytest.mark.parametrize(
    ("make_env", "reason"),
    [
        (lambda release: raising_env, "environment raised KeyError: 'board'"),
        (lambda release: lambda messages: release.wait(30), "environment timed out after 0.3 s"),
        (lambda release: wrong_type_env, "an environment returns Reply, str or None, not int"),
    ],
)
async def test_failing_environment_ends_the_episode_with_zero_reward(
    release, make_env: Callable[[threading.Event], Any], reason: str
) -> None:
    scored: list[float] = []
    with ScriptedServer([Step.reply("50")], default=Step.reply("again")) as server:
        episode = Episode(
            [USER], respond=make_env(release), reward=lambda m: scored.append(1) or 1.0,
            timeout_s=0.3,
        )  # fmt: skip
        t = await run_episode(scripted_model(server), episode)
        assert len(server.chat_requests) == 1
    assert kinds(t) == ["user", "choice"]
    assert (t.reward, t.metrics["env_error"], t.metrics["turn_cap_hit"]) == (0.0, 1, 0)
    assert scored == []  # no reward for an episode the environment could not finish
    assert any("episode ended" in line and reason in line for line in t.logs)
    assert feedback_of(t).startswith("the environment failed, reward 0: ")


async def test_environment_str_reply_and_scorer_failure() -> None:
    replies = iter(["try again", None])

    async def env(messages: Messages) -> str | None:
        return next(replies)

    def score(messages: Messages) -> float:
        raise RuntimeError("grader down")

    with ScriptedServer([Step.reply("1"), Step.reply("2")]) as server:
        t = await run_episode(scripted_model(server), Episode([USER], respond=env, reward=score))
    assert kinds(t) == ["user", "choice", "user", "choice"]
    assert t.messages_and_choices[2] == {"role": "user", "content": "try again"}
    assert (t.reward, t.metrics["reward_error"], t.metrics["env_error"]) == (0.0, 1, 0)
    assert feedback_of(t) == "the reward failed, reward 0: reward raised RuntimeError: grader down"
    assert any("scoring failed" in line and "grader down" in line for line in t.logs)


@pytest.mark.parametrize(
    ("verdict", "reward", "reason"),
    [
        (True, 1.0, None),
        (0.25, 0.25, None),
        (Score(reward=0.5, metrics={"correct": 1.0}), 0.5, None),
        (1.5, 0.0, "a reward's number is in [0, 1]"),
        (float("nan"), 0.0, "a reward's number is in [0, 1]"),
        ("1.0", 0.0, "returned str"),
    ],
)
async def test_a_scorer_returns_what_a_reward_may(verdict, reward: float, reason) -> None:
    """One verdict type: an episode scorer returns a `Score`, a number in [0, 1] or a bool,
    like a reward; anything else scores 0 with the reason logged."""
    with ScriptedServer([Step.reply("1")]) as server:
        t = await run_episode(scripted_model(server), Episode([USER], reward=lambda m: verdict))
    assert (t.reward, t.metrics["reward_error"]) == (reward, float(reason is not None))
    if reason is not None:
        assert any("scoring failed" in line and reason in line for line in t.logs)


async def test_bad_setup_is_refused_before_any_request() -> None:
    def also_add(a: int) -> int:
        return a

    with ScriptedServer([Step.reply("x")]) as server:
        model = scripted_model(server)
        with pytest.raises(ValueError, match="two tools share a name: add"):
            await run_episode(model, Episode([USER], tools=(add, tool(also_add, name="add"))))
        with pytest.raises(ValueError, match="max_turns must be >= 1"):
            await run_episode(model, Episode([USER], max_turns=0))
        assert server.chat_requests == []


# ---- schemas from signatures ------------------------------------------------------------------


class Unit(enum.Enum):
    C = "celsius"
    F = "fahrenheit"


class Point(BaseModel):
    x: int
    y: int


class Options(TypedDict):
    fast: bool


def google(city: str, days: int = 1) -> str:
    """Forecast.

    Args:
        city: The city's name,
            as written locally.
        days: How many days.
    """
    return city


def numpy_style(city: str) -> str:
    """Forecast.

    Parameters
    ----------
    city : str
        The city's name.
    """
    return city


def optional(note: str | None = None) -> str:
    return str(note)


def literal(mode: Literal["fast", "slow"] = "fast") -> str:
    return mode


def enum_param(unit: Unit) -> str:
    return unit.value


def listed(xs: list[int], tags: list[str] | None = None) -> int:
    return sum(xs)


def nested(p: Point) -> int:
    return p.x


def typed_dict(opts: Options) -> bool:
    return opts["fast"]


def kinds_of_params(a: int, /, b: str, *, c: float = 0.5) -> str:
    return f"{a}{b}{c}"


def shadowing(json: str, model_config: int) -> str:
    """Parameter names that pydantic's BaseModel uses itself."""
    return json


async def asynchronous(q: str) -> str:
    """Search."""
    return q


@pytest.mark.parametrize(
    ("fn", "description", "parameters"),
    [
        (
            google,
            "Forecast.",
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["city"],
                "properties": {
                    "city": {
                        "type": "string",
                        "description": "The city's name, as written locally.",
                    },
                    "days": {"type": "integer", "default": 1, "description": "How many days."},
                },
            },
        ),
        (
            numpy_style,
            "Forecast.",
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["city"],
                "properties": {"city": {"type": "string", "description": "The city's name."}},
            },
        ),
        (
            optional,
            None,
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
                },
            },
        ),
        (
            literal,
            None,
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "mode": {"enum": ["fast", "slow"], "type": "string", "default": "fast"}
                },
            },
        ),
        (
            enum_param,
            None,
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["unit"],
                "properties": {"unit": {"$ref": "#/$defs/Unit"}},
                "$defs": {
                    "Unit": {"enum": ["celsius", "fahrenheit"], "title": "Unit", "type": "string"}
                },
            },
        ),
        (
            listed,
            None,
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["xs"],
                "properties": {
                    "xs": {"type": "array", "items": {"type": "integer"}},
                    "tags": {
                        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                        "default": None,
                    },
                },
            },
        ),
        (
            nested,
            None,
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["p"],
                "properties": {"p": {"$ref": "#/$defs/Point"}},
                "$defs": {
                    "Point": {
                        "properties": {
                            "x": {"title": "X", "type": "integer"},
                            "y": {"title": "Y", "type": "integer"},
                        },
                        "required": ["x", "y"],
                        "title": "Point",
                        "type": "object",
                    }
                },
            },
        ),
        (
            typed_dict,
            None,
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["opts"],
                "properties": {"opts": {"$ref": "#/$defs/Options"}},
                "$defs": {
                    "Options": {
                        "properties": {"fast": {"title": "Fast", "type": "boolean"}},
                        "required": ["fast"],
                        "title": "Options",
                        "type": "object",
                        "additionalProperties": False,
                    }
                },
            },
        ),
        (
            kinds_of_params,
            None,
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["a", "b"],
                "properties": {
                    "a": {"type": "integer"},
                    "b": {"type": "string"},
                    "c": {"type": "number", "default": 0.5},
                },
            },
        ),
        (
            shadowing,
            "Parameter names that pydantic's BaseModel uses itself.",
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["json", "model_config"],
                "properties": {"json": {"type": "string"}, "model_config": {"type": "integer"}},
            },
        ),
        (
            asynchronous,
            "Search.",
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["q"],
                "properties": {"q": {"type": "string"}},
            },
        ),
    ],
)
def test_schema_from_signature(fn, description, parameters) -> None:
    definition = tool(fn).definition
    expected = {"name": fn.__name__, "parameters": parameters}
    if description is not None:
        expected["description"] = description
    assert definition == {"type": "function", "function": expected}


@pytest.mark.parametrize(
    ("fn", "arguments", "content"),
    [
        (nested, {"p": {"x": 4, "y": 5}}, "4"),  # a pydantic model arrives as the model
        (typed_dict, {"opts": {"fast": True}}, "true"),
        (enum_param, {"unit": "fahrenheit"}, "fahrenheit"),  # an enum arrives as the enum
        (kinds_of_params, {"a": "7", "b": "x"}, "7x0.5"),  # lax: "7" validates as 7
        (shadowing, {"json": "j", "model_config": 1}, "j"),
        (asynchronous, {"q": "bm25"}, "bm25"),
    ],
)
async def test_arguments_are_validated_into_the_signature(fn, arguments, content) -> None:
    with ScriptedServer([Step.calls((fn.__name__, arguments)), Step.reply("done")]) as server:
        t = await run_episode(scripted_model(server), Episode([USER], tools=(fn,)))
    assert t.messages_and_choices[2]["content"] == content
    assert t.metrics["tool_errors"] == 0


def test_unnamed_parameters_are_refused() -> None:
    def variadic(*xs: int) -> int:
        return sum(xs)

    with pytest.raises(ValueError, match=r"tool variadic: \*xs"):
        tool(variadic)


def test_tool_choice_and_overrides() -> None:
    t = tool(google, name="forecast", description="Weather ahead.", timeout_s=2.5)
    assert t.definition["function"]["name"] == "forecast"
    assert t.definition["function"]["description"] == "Weather ahead."
    assert t.timeout_s == 2.5
    assert json.loads(json.dumps(t.definition)) == t.definition  # JSON-able as sent


EPISODE_UNDER_WEAVE = """
import asyncio, sys
from art_rlvr.core.types import Episode
from art_rlvr.rollouts.loop import run_episode
from art_rlvr.observe.tracing import finish_weave, setup_weave
from art_rlvr.testing import ScriptedServer, Step, scripted_model
from art_rlvr.testing.trace_server import RecordingTraceServer
import art

def add(a: int, b: int) -> int:
    return a + b

async def main():
    assert setup_weave("tester/episodes")
    script = [Step.calls(("add", {"a": 2, "b": 3}), ("add", "{bad")), Step.reply("5")]
    with ScriptedServer(script) as server:
        model = art.Model(name="e", project="t", inference_base_url=server.base_url,
                          inference_api_key="k", inference_model_name="scripted")
        await run_episode(model, Episode([{"role": "user", "content": "2+3?"}], tools=(add,)))
    finish_weave()

asyncio.run(main())
"""


def test_weave_shows_the_episode_its_turns_and_tool_calls() -> None:
    """Spans per episode, per turn and per tool call (issue 21's trajectory browser and
    curves read them), recorded by a trace server on loopback in a child process."""
    with RecordingTraceServer() as trace:
        env = {k: v for k, v in os.environ.items() if k != "WEAVE_DISABLED"} | {
            "WF_TRACE_SERVER_URL": f"{trace.url}/traces",
            "WANDB_BASE_URL": trace.url,
            "WANDB_API_KEY": "wandb-fake-key-0123456789abcdef0123456789abcdef01234567",
            "WANDB_ERROR_REPORTING": "false",
        }
        done = subprocess.run(
            [sys.executable, "-c", EPISODE_UNDER_WEAVE],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        calls = trace.calls()
    names = {c["id"]: c["name"] for c in calls}
    by_name: dict[str, list[dict]] = {}
    for call in calls:
        by_name.setdefault(call["name"], []).append(call)
    (episode,) = by_name["art_rlvr.episode"]
    turns, tool_calls = by_name["art_rlvr.turn"], by_name["art_rlvr.tool"]
    assert [c["inputs"]["index"] for c in turns] == [0, 1]
    assert {names[c["parent_id"]] for c in turns + tool_calls} == {"art_rlvr.episode"}
    shown = sorted((c["inputs"]["arguments"], c["output"]["status"]) for c in tool_calls)
    assert shown == [('{"a": 2, "b": 3}', "ok"), ("{bad", "invalid_arguments")]
    assert episode["output"]["metrics"]["tool_errors"] == 1


def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


async def test_episode_on_torch_backend_with_the_embedded_model(model) -> None:
    """A real episode on TorchBackend: the named tool_choice forces a schema-valid call on
    turn 0 (constrained decoding), the tool answers, and the model gets its turn again under
    `auto`. Every sampled turn keeps the server's token ids and logprobs for training."""
    opening = [
        {"role": "system", "content": "Use the multiply tool for products."},
        {"role": "user", "content": "What is 1234 * 5678?"},
    ]
    t = await run_episode(
        model,
        Episode(opening, tools=(multiply,), tool_choice="multiply", max_turns=3),
        sampling=SamplingConfig(max_tokens=48, temperature=0, seed=0),
    )
    choices = [m for m in t.messages_and_choices if isinstance(m, Choice)]
    assert t.tools == [tool(multiply).definition]
    assert len(choices) == t.metrics["turns"] >= 2
    first = choices[0]
    (call,) = first.message.tool_calls
    assert first.finish_reason == "tool_calls" and call.function.name == "multiply"
    answer = t.messages_and_choices[3]
    assert answer["tool_call_id"] == call.id
    args = json.loads(call.function.arguments)
    assert answer["content"] == str(args["a"] * args["b"])  # the call validated and ran
    for c in choices:
        assert c.model_extra["token_ids"] and c.model_extra["prompt_token_ids"]
        assert len(c.logprobs.content) == len(c.model_extra["token_ids"])
