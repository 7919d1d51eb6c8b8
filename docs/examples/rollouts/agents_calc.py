"""An OpenAI Agents SDK agent as a scenario's rollout function (docs/rollouts.md).

Written as an ART user writes a rollout: ART's client, ART's capture scope (`with trajectory:`
records every request as the trajectory's `exchanges`, the served token ids included), its own
reward. The third parameter is art_rlvr's `RolloutContext`: the agent's instructions are
`context.system_prompt` (what GEPA evolves), its sampling is the run's.
"""

from typing import Any

import art
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
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


async def rollout(model: art.Model, record: dict[str, Any], context: Any) -> art.Trajectory:
    """Multiply `record["a"]` by `record["b"]` with a tool the first turn must call."""
    sampling = context.sampling
    agent = Agent(
        name="calculator",
        instructions=context.system_prompt,
        tools=[multiply],
        output_type=Product,
        model=OpenAIChatCompletionsModel(
            model=model.get_inference_name(context.step), openai_client=model.openai_client()
        ),
        model_settings=ModelSettings(
            tool_choice="required",
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            extra_body={"seed": sampling.seed} if sampling.seed is not None else None,
        ),
    )
    trajectory = art.Trajectory(reward=0.0)
    with trajectory:  # ART records every request to the model as the trajectory's `exchanges`
        try:
            result = await Runner.run(agent, f"What is {record['a']} * {record['b']}?", max_turns=3)
        except AgentsException as error:  # e.g. an answer cut by max_tokens: no valid JSON
            trajectory.log(f"agent failed: {error}")  # the sampled turns still train
            return trajectory
    trajectory.reward = float(result.final_output.value == record["answer"])
    return trajectory
