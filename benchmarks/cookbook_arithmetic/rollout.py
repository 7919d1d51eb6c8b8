"""tinker-cookbook's arithmetic task (`tinker_cookbook.recipes.math_rl.arithmetic_env`) as an
ART rollout function, so that art_rlvr trains on the very conversation and reward the recipe
does (benchmarks/tinker_cookbook_arith.py): the few-shot turn "What is 4 + 5?" / "9", then
"What is x + y?", no system message; correct when the last integer of the reply is x + y;
reward = correct + 0.1 x (format - 1), format = the reply ended at the renderer's stop token."""

from __future__ import annotations

import re
from typing import Any

import art

FEW_SHOT = [
    {"role": "user", "content": "What is 4 + 5?"},
    {"role": "assistant", "content": "9"},
]
INTEGER = re.compile(r"-?\d+")
FORMAT_COEF = 0.1


def last_integer(text: str) -> int | None:
    found = INTEGER.findall(text.replace(",", ""))
    return int(found[-1]) if found else None


async def rollout(model: art.Model, record: dict[str, Any], context: Any) -> art.Trajectory:
    messages = [*FEW_SHOT, {"role": "user", "content": f"What is {record['x']} + {record['y']}?"}]
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(context.step),
        messages=messages,  # type: ignore[arg-type]
        max_tokens=context.sampling.max_tokens,
        temperature=context.sampling.temperature,
        seed=context.sampling.seed,
    )
    choice = completion.choices[0]
    correct = last_integer(choice.message.content or "") == record["x"] + record["y"]
    formatted = choice.finish_reason == "stop"
    return art.Trajectory(
        messages_and_choices=[*messages, choice],
        reward=float(correct) + FORMAT_COEF * (float(formatted) - 1.0),
        metrics={"correct": float(correct), "format": float(formatted)},
    )
