"""The record of served completions and the one rendering of tools and messages, as pure data:
keys that survive what clients do to a reply (LangChain, the Agents SDK, ART's storage), a
bounded size, and no guess where two served prompts disagree."""

from __future__ import annotations

import json

import art
import pytest
from openai.types.chat.chat_completion import Choice

from art_rlvr.backend.chat.render import canonical_message, canonical_tools
from art_rlvr.backend.serving.served import ServedLog, skeleton, turn_key

TOOL = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two integers.",
        "parameters": {
            "type": "object",
            "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
PROMPT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "3 x 4?"}]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "multiply", "arguments": '{"a":3,"b":4}'},
}
SERVED_REPLY = {"role": "assistant", "content": None, "tool_calls": [CALL]}


def test_art_storage_order_and_client_order_give_one_canonical_tool() -> None:
    stored = art.Trajectory(messages_and_choices=PROMPT, tools=[TOOL]).tools
    assert list(stored[0]) == ["function", "type"]  # ART reorders the envelope
    assert canonical_tools(stored) == canonical_tools([TOOL]) == [TOOL]
    assert json.dumps(canonical_tools(stored)) == json.dumps([TOOL])  # key order, not just ==
    schema = canonical_tools(stored)[0]["function"]["parameters"]
    assert list(schema["properties"]) == ["b", "a"]  # the client's schema keeps its order


@pytest.mark.parametrize(
    "returned",
    [
        # LangChain (through ART's LangGraph integration): content "" for None, arguments
        # re-serialised from the parsed dict, its own keys beside "function"
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "name": "multiply",
                    "args": {"a": 3, "b": 4},
                    "type": "function",
                    "function": {"name": "multiply", "arguments": '{"a": 3, "b": 4}'},
                }
            ],
        },
        # the OpenAI SDK's objects, as a Choice's message
        Choice.model_validate(
            {"index": 0, "finish_reason": "tool_calls", "message": SERVED_REPLY}
        ).message,
    ],
    ids=["langchain", "openai-sdk"],
)
def test_a_reply_keeps_its_key_through_a_client(returned) -> None:
    assert turn_key(PROMPT, returned) == turn_key(PROMPT, SERVED_REPLY)
    assert canonical_message(returned)["tool_calls"][0]["function"]["name"] == "multiply"


@pytest.mark.parametrize(
    "other",
    [
        {"role": "assistant", "content": "12"},
        {
            **SERVED_REPLY,
            "tool_calls": [
                {**CALL, "function": {**CALL["function"], "arguments": '{"a": 4, "b": 3}'}}
            ],
        },
    ],
    ids=["text", "other-arguments"],
)
def test_another_reply_has_another_key(other) -> None:
    assert turn_key(PROMPT, other) != turn_key(PROMPT, SERVED_REPLY)


def test_skeleton_keeps_what_every_client_keeps() -> None:
    assert skeleton({"role": "developer", "content": [{"type": "text", "text": "hi"}]}) == [
        "system",
        "hi",
        [],
    ]
    assert skeleton(SERVED_REPLY) == ["assistant", "", [["multiply", '{"a": 3, "b": 4}']]]


def served(log: ServedLog, response_id: str, prompt_ids: list[int], tools=None) -> None:
    log.add(PROMPT, tools, response_id, prompt_ids, [(SERVED_REPLY, [7, 8], [-0.1, -0.2], "stop")])


def test_record_is_bounded_and_drops_the_oldest_first() -> None:
    log = ServedLog(max_turns=3)
    for n in range(5):
        log.add(
            PROMPT,
            None,
            f"r{n}",
            [1],
            [({"role": "assistant", "content": f"{n}"}, [n], [0.0], "stop")],
        )
    assert len(log) == 3
    assert log.by_id("r1", 0) is None and log.by_id("r4", 0) is not None
    assert log.find(PROMPT, None, {"role": "assistant", "content": "1"}) is None
    assert log.find(
        PROMPT, None, {"role": "assistant", "content": "4"}
    ).completion_ids.tolist() == [4]


def test_find_prefers_the_response_id_then_the_tools() -> None:
    log = ServedLog()
    served(log, "r-plain", [1, 2])
    served(log, "r-tools", [1, 2, 3], tools=[TOOL])
    assert log.find(PROMPT, None, SERVED_REPLY, "r-tools").response_id == "r-tools"
    assert log.find(PROMPT, [TOOL], SERVED_REPLY).response_id == "r-tools"
    assert log.find(PROMPT, None, SERVED_REPLY).response_id == "r-plain"


def test_find_refuses_to_guess_between_disagreeing_prompts() -> None:
    """Served twice under tools the trajectory does not name, with different prompt ids: which
    one this turn was is unknown, so neither is taken."""
    other = {**TOOL, "function": {**TOOL["function"], "name": "add"}}
    log = ServedLog()
    served(log, "r1", [1, 2], tools=[TOOL])
    served(log, "r2", [1, 2, 3], tools=[other])
    assert log.find(PROMPT, None, SERVED_REPLY) is None
    same = ServedLog()
    served(same, "r1", [1, 2], tools=[TOOL])
    served(same, "r2", [1, 2], tools=[TOOL])
    assert same.find(PROMPT, None, SERVED_REPLY) is not None  # both true samples of one prompt


def test_one_reply_sampled_twice_is_handed_out_once_each_per_batch() -> None:
    """Two requests returned the same text split into different tokens: a batch holding both
    turns trains each sample once (oldest first), and a new batch starts over."""
    log = ServedLog()
    reply = {"role": "assistant", "content": "Twelve."}
    for n, ids in enumerate(([5, 6], [5, 7, 8])):
        log.add(PROMPT, None, f"r{n}", [1], [(reply, ids, [0.0] * len(ids), "stop")])
    claimed: set[tuple[str, int]] = set()
    found = [log.find(PROMPT, None, reply, claimed=claimed).completion_ids.tolist() for _ in "abc"]
    assert found == [[5, 6], [5, 7, 8], [5, 6]]
    assert log.find(PROMPT, None, reply, claimed=set()).completion_ids.tolist() == [5, 6]


def test_call_ids_tell_apart_conversations_of_equal_text() -> None:
    """The template renders a tool result's `tool_call_id`: two conversations equal in text but
    not in call ids were served different prompts, and each reply finds its own."""
    log = ServedLog()
    for n in (1, 2):
        call = {**CALL, "id": f"call_{n}"}
        messages = [
            *PROMPT,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{n}", "content": "12"},
        ]
        log.add(messages, [TOOL], f"r{n}", [n] * 3, [(REPLY_12, [9], [0.0], "stop")])
    for n in (1, 2):
        messages = [
            *PROMPT,
            {"role": "assistant", "content": "", "tool_calls": [{**CALL, "id": f"call_{n}"}]},
            {"role": "tool", "tool_call_id": f"call_{n}", "content": "12"},
        ]
        assert log.find(messages, [TOOL], REPLY_12).prompt_ids.tolist() == [n] * 3


REPLY_12 = {"role": "assistant", "content": "12"}
