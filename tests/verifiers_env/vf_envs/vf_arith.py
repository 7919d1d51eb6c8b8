"""A single-turn verifiers taskset the embedded model can learn: 1-digit additions, scored by
the last number of the reply; two metrics say how brief the reply was."""

import random

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: str = ""


def last_number(text: str) -> str:
    words = [w.strip(".,!") for w in text.replace("=", " ").split()]
    return next((w for w in reversed(words) if w.lstrip("-").isdigit()), "")


class ArithTask(vf.Task[ArithData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task: ArithData, trace: vf.Trace) -> float:
        return float(last_number(trace.last_reply) == task.answer)

    @vf.metric
    async def bare(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == last_number(trace.last_reply) != "")

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class ArithTasksetConfig(vf.TasksetConfig):
    n: int = 40
    seed: int = 0
    max_value: int = 9


class ArithTaskset(vf.Taskset[ArithTask, ArithTasksetConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for _ in range(self.config.n):
            a, b = rng.randint(1, self.config.max_value), rng.randint(1, self.config.max_value)
            yield ArithTask(
                ArithData(
                    prompt=f"{a} + {b} =",
                    answer=str(a + b),
                    system_prompt="Reply with only the number.",
                )
            )


__all__ = ["ArithTaskset"]
