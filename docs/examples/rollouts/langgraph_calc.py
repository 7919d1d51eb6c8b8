"""A LangGraph ReAct agent through ART's `art.langgraph`, as a scenario's rollout function
(docs/rollouts.md).

ART's `wrap_rollout` records the agent's model calls and fills the trajectory's messages; the
trainer finds each turn's served token ids from them. `init_chat_model` takes the step's model
name, so each step samples the newest weights.
"""

from typing import Any

import art
from art.langgraph import init_chat_model, wrap_rollout
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


async def agent_run(model: art.Model, record: dict[str, Any], context: Any) -> art.Trajectory:
    """A ReAct agent whose first turn must call `multiply`, then answers."""
    sampling = context.sampling
    chat = {
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        **({"seed": sampling.seed} if sampling.seed is not None else {}),
    }
    name = model.get_inference_name(context.step)
    first = {"tool_choice": {"type": "function", "function": {"name": "multiply"}}}
    forced = init_chat_model(name, model_kwargs=first, **chat)
    free = init_chat_model(name, **chat)
    agent = create_react_agent(
        lambda state, runtime: (
            free if any(m.type == "tool" for m in state["messages"]) else forced
        ).bind_tools([multiply]),
        tools=[multiply],
        prompt=context.system_prompt,
    )
    question = f"What is {record['a']} * {record['b']}?"
    state = await agent.ainvoke({"messages": [("user", question)]}, {"recursion_limit": 6})
    answer = str(state["messages"][-1].content)
    return art.Trajectory(messages_and_choices=[], reward=float(str(record["answer"]) in answer))


async def rollout(model: art.Model, record: dict[str, Any], context: Any) -> art.Trajectory:
    return await wrap_rollout(model, agent_run)(model, record, context)
