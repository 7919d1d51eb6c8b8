"""art_rlvr's in-process verifiers harness: a verifiers 0.4 `Harness` whose loop is art_rlvr's
own episode loop (`art_rlvr.rollouts.loop.run_episode`), run in the trainer's event loop.

verifiers runs each rollout's harness as a program that talks to its interception proxy;
`Harness.launch`'s contract allows a harness to run its loop in-process instead, as long as every
model call goes through `endpoint` + `secret` (the proxy, which records the trace and forwards
each call to the policy). So no `uv` script and no subprocess per rollout: each model call is an
OpenAI SDK request to the proxy, and the MCP tools the task's `vf.Toolset`s serve (`mcp_urls`)
become art_rlvr tools (`rollouts.tools.tool` over an `McpServer`), with the project's timeout,
output cap and error-as-tool-message rules. Selected by the harness id
`art_rlvr.rollouts.verifiers.harness` (the default of a verifiers scenario).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import verifiers.v1 as vf
from openai import AsyncOpenAI
from pydantic import Field
from verifiers.v1.runtimes import ProgramResult

from art_rlvr.core.types import Episode
from art_rlvr.rollouts.loop import run_episode
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.rollouts.tools import DEFAULT_MAX_CHARS, DEFAULT_TIMEOUT_S, Tool, tool
from art_rlvr.scenarios.environments.mcp_tools import McpServer, McpServerSpec, list_tools


class ArtRlvrHarnessConfig(vf.HarnessConfig):
    """The harness's limits: tool calls as art_rlvr's function tools run them."""

    max_turns: int = Field(default=8, ge=1)  # sampled turns per segment
    tool_timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    tool_max_chars: int = Field(default=DEFAULT_MAX_CHARS, ge=1)
    # "auto", "required", "none" or a tool's name, until the first call (as run_episode does)
    tool_choice: str | None = None


@dataclass(frozen=True)
class ProxyModel:
    """What `run_episode` asks of a model, pointed at verifiers' interception proxy: the
    client (the rollout's endpoint and secret) and the model name the rollout runs under."""

    name: str
    client: AsyncOpenAI

    def openai_client(self) -> AsyncOpenAI:
        return self.client

    def get_inference_name(self, step: int | None = None) -> str:
        return self.name


def sampling_of(ctx: vf.ModelContext) -> SamplingConfig:
    """The rollout's sampling (art_rlvr's settings, passed through verifiers' ModelContext)."""
    s = ctx.sampling
    extra = s.model_extra or {}
    return SamplingConfig(
        max_tokens=s.max_tokens or SamplingConfig().max_tokens,
        temperature=1.0 if s.temperature is None else s.temperature,
        top_p=1.0 if s.top_p is None else s.top_p,
        seed=extra.get("seed"),
    )


def opening(system: str | None, prompt: Any) -> list[dict[str, object]]:
    """The episode's first messages: the task's system prompt, then its prompt (text or
    messages, as verifiers' `resolve_prompt` gives them)."""
    head: list[dict[str, object]] = [{"role": "system", "content": system}] if system else []
    if isinstance(prompt, str):
        return [*head, {"role": "user", "content": prompt}]
    return [*head, *(m.model_dump(exclude_none=True) for m in prompt or [])]


async def mcp_tools(
    stack: AsyncExitStack, urls: Mapping[str, str], config: ArtRlvrHarnessConfig
) -> list[Tool]:
    """Every tool of the rollout's MCP servers, named `<server>_<tool>` as verifiers' own
    harnesses name them, run under the harness's timeout and output cap."""
    found = []
    for server, url in urls.items():
        spec = McpServerSpec(url=url, max_restarts=1)
        connection = McpServer(spec, await list_tools(spec))
        stack.push_async_callback(connection.aclose)
        disabled = set(config.disabled_tools or ())
        found += [
            tool(
                t,
                name=f"{server}_{t.name}" if server else t.name,
                timeout_s=config.tool_timeout_s,
                max_chars=config.tool_max_chars,
            )
            for t in connection.tools
            if t.name not in disabled
        ]
    return found


class ArtRlvrHarness(vf.Harness[ArtRlvrHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True  # the task's system prompt is the system message (GEPA's)
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True  # a multi-turn env's next segment relaunches on the conversation
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: Any,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> ProgramResult:
        system, prompt = self.resolve_prompt(data)
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        async with AsyncExitStack() as stack:
            stack.push_async_callback(client.close)
            tools = await mcp_tools(stack, mcp_urls, self.config)
            episode = await run_episode(
                ProxyModel(ctx.model, client),  # type: ignore[arg-type]
                Episode(
                    messages=opening(system, prompt),
                    tools=tuple(tools),
                    tool_choice=self.config.tool_choice if tools else None,
                    max_turns=self.config.max_turns,
                ),
                sampling=sampling_of(ctx),
            )
        return ProgramResult(exit_code=0, stdout="\n".join(episode.logs), stderr="")


__all__ = ["ArtRlvrHarness"]
