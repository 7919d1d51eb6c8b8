"""Rollout functions for tests/rollouts/test_rollout_functions.py: good ones that really sample
from the model (ART's shapes among them: two parameters and a system message of their own,
rewards such as -100, -1 or 5), and one per way a user's function goes wrong."""

from __future__ import annotations

import asyncio
from typing import Any

import art


async def answer(model: art.Model, record: dict[str, Any], context: Any) -> art.Trajectory:
    """ART's plain shape: one request with ART's client, the choice kept, a reward set."""
    messages = [
        {"role": "system", "content": context.system_prompt},
        {"role": "user", "content": f"What is {record['a']} {record['op']} {record['b']}?"},
    ]
    response = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(context.step),
        messages=messages,
        max_tokens=context.sampling.max_tokens,
        temperature=context.sampling.temperature,
        seed=context.sampling.seed,
        logprobs=True,
    )
    choice = response.choices[0]
    trajectory = art.Trajectory(messages_and_choices=[*messages, choice], reward=0.0)
    trajectory.reward = float(str(record["answer"]) in (choice.message.content or ""))
    trajectory.metrics["correct"] = trajectory.reward
    return trajectory


async def captured(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    """Two parameters, no messages kept: art_rlvr's capture scope records the request."""
    client = model.openai_client()
    await client.chat.completions.create(
        model=model.get_inference_name(),
        messages=[{"role": "user", "content": f"{record['a']} + {record['b']} ="}],
        max_tokens=4,
    )
    return art.Trajectory(reward=1.0)


async def always_right(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    return art.Trajectory(reward=1.0)


async def raises(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    raise RuntimeError(f"agent crashed on {record['id']}")


async def hangs(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    await asyncio.sleep(3600)
    return art.Trajectory(reward=1.0)


async def no_reward(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    return art.Trajectory()


async def nan_reward(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    return art.Trajectory(reward=float("nan"))


async def returns_float(model: art.Model, record: dict[str, Any]) -> float:
    return 1.0


async def returns_none(model: art.Model, record: dict[str, Any]) -> None:
    return None


async def own_timeout(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    raise TimeoutError("the agent's own HTTP timeout")


def not_async(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    return art.Trajectory(reward=1.0)


async def one_param(model: art.Model) -> art.Trajectory:
    return art.Trajectory(reward=1.0)


async def four_params(model: art.Model, record: Any, context: Any, extra: Any) -> art.Trajectory:
    return art.Trajectory(reward=1.0)


NOT_A_FUNCTION = 42


async def prompt_judged(model: art.Model, record: dict[str, Any], context: Any) -> art.Trajectory:
    """Right exactly when the system prompt asks to check twice: GEPA's candidate, received as
    `context.system_prompt`, decides the reward (no model call: a test of the wiring)."""
    asked = "check twice" in context.system_prompt.lower()
    question = f"What is {record['a']} + {record['b']}?"
    reply = str(record["answer"]) if asked else "no idea"
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": context.system_prompt},
            {"role": "user", "content": question},
            {"role": "assistant", "content": reply},
        ],
        reward=float(asked),
    )
    trajectory.metadata["feedback"] = (
        "right" if asked else "wrong: the prompt should say check twice"
    )
    return trajectory


OWN_SYSTEM = "You are a calculator."


async def game_like(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    """ART's 2048 shape, unchanged: two parameters, its own system message, ART's client, the
    choice kept, a reward in {-1, 0, 1} (-1: a reply without a number, as an illegal move)."""
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": OWN_SYSTEM},
            {"role": "user", "content": f"What is {record['a']} {record['op']} {record['b']}?"},
        ],
        reward=0,
    )
    response = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=trajectory.messages(), max_completion_tokens=8
    )
    choice = response.choices[0]
    trajectory.messages_and_choices.append(choice)
    reply = choice.message.content or ""
    if str(record["answer"]) in reply:
        trajectory.reward = 1
    elif not any(c.isdigit() for c in reply):
        trajectory.reward = -1
    return trajectory


async def own_client(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    """Two parameters and a client of its own (not `model.openai_client()`): a system prompt
    the run asks for cannot reach it."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=model.inference_base_url, api_key="k")
    await client.chat.completions.create(
        model=model.get_inference_name(),
        messages=[{"role": "user", "content": f"{record['a']} + {record['b']} ="}],
        max_tokens=4,
    )
    await client.close()
    return art.Trajectory(reward=1.0)


async def minus_hundred(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    """ART's tic-tac-toe penalty for an illegal move."""
    return art.Trajectory(reward=-100.0)


async def five(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    return art.Trajectory(reward=5.0)


async def five_marked_wrong(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    return art.Trajectory(reward=5.0, metrics={"correct": 0.0})


async def minus_one_marked_right(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    return art.Trajectory(reward=-1.0, metrics={"correct": 1.0})


async def inf_reward(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    return art.Trajectory(reward=float("inf"))


async def five_or_minus_hundred(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    """One request through ART's client: 5 for the right answer, -100 for anything else."""
    response = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=[{"role": "user", "content": f"What is {record['a']} + {record['b']}?"}],
        max_tokens=8,
    )
    right = str(record["answer"]) in (response.choices[0].message.content or "")
    return art.Trajectory(reward=5.0 if right else -100.0)


async def step_and_validation(model: art.Model, step: int, is_validation: bool) -> art.Trajectory:
    """ART's 2048 signature: the third parameter is no context."""
    return art.Trajectory(reward=1.0)


async def own_flag(
    model: art.Model, record: dict[str, Any], verbose: bool = False
) -> art.Trajectory:
    """A third parameter of its own with a default: left to it, never handed a context."""
    return art.Trajectory(reward=float(verbose is False))
