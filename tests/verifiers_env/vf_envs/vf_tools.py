"""A tool taskset: an MCP `vf.Toolset` (served per rollout as `python -m` this module) whose
`add` tool the model may call; `add(99, ...)` raises, `add(98, ...)` floods its output."""

import verifiers.v1 as vf


class AddToolset(vf.Toolset[vf.ToolsetConfig]):
    @vf.tool
    async def add(self, a: int, b: int) -> str:
        """Add two integers."""
        if a == 99:
            raise ValueError("tool exploded")
        if a == 98:
            return "x" * 100_000
        return str(a + b)


class CalcData(vf.TaskData):
    answer: str = ""


class CalcTask(vf.Task[CalcData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [AddToolset(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, task: CalcData, trace: vf.Trace) -> float:
        return float(task.answer in trace.last_reply)

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class CalcTaskset(vf.Taskset[CalcTask, vf.TasksetConfig]):
    def load(self):
        for a, b in [(2, 3), (4, 5), (99, 1), (98, 1)]:
            yield CalcTask(
                CalcData(
                    prompt=f"Use the add tool: what is {a} + {b}?",
                    answer=str(a + b),
                    system_prompt="Call the add tool, then give the sum.",
                )
            )


__all__ = ["CalcTaskset"]

if __name__ == "__main__":
    AddToolset.run()
