"""Rollout functions for tests/rollouts/test_rollout_functions.py: one good one that really samples from
the model, and one per way a user's function goes wrong."""

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


async def big_reward(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    return art.Trajectory(reward=2.0)


async def negative_reward(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    return art.Trajectory(reward=-0.5)


async def returns_float(model: art.Model, record: dict[str, Any]) -> float:
    return 1.0


async def returns_none(model: art.Model, record: dict[str, Any]) -> None:
    return None


async def own_timeout(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    raise TimeoutError("the agent's own HTTP timeout")


async def claims_correct(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
    """Says it is correct with an impossible reward: the failure wins."""
    return art.Trajectory(reward=5.0, metrics={"correct": 1.0})


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
