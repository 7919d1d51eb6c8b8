"""A multi-turn env: the environment plays the user and says "Wrong, try again." until the
reply holds the answer or `max_tries` replies were given."""

import verifiers.v1 as vf


class RetryData(vf.TaskData):
    answer: str = ""


class RetryTask(vf.Task[RetryData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task: RetryData, trace: vf.Trace) -> float:
        return float(task.answer in trace.last_reply)

    @vf.metric
    async def tries(self, trace: vf.Trace) -> float:
        return float(sum(m.role == "assistant" for m in trace.messages))


class RetryTaskset(vf.Taskset[RetryTask, vf.TasksetConfig]):
    def load(self):
        for a, b in [(2, 3), (3, 4), (1, 6)]:
            yield RetryTask(
                RetryData(
                    prompt=f"{a} + {b} =", answer=str(a + b), system_prompt="Reply with a number."
                )
            )


class RetryEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()
    max_tries: int = 2


class RetryEnv(vf.Env[RetryEnvConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as chat:
            segment = await chat.turn()
            for _ in range(self.config.max_tries - 1):
                if segment.terminated or task.data.answer in (segment.last_reply or ""):
                    break
                segment = await chat.turn("Wrong, try again.")


__all__ = ["RetryEnv", "RetryTaskset"]
