"""A verifiers 0.4 taskset (docs/verifiers.md): two-number integer arithmetic, scored by its
own rubric. Written as a verifiers user writes one; art_rlvr runs it as a scenario."""

import random
import re

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: str = ""


def parsed_answer(reply: str) -> str:
    """The number after the last '=', else the first number of the reply."""
    tail = reply.rsplit("=", 1)[-1] if "=" in reply else reply
    found = re.search(r"-?\d+", tail) or re.search(r"-?\d+", reply)
    return found.group() if found else ""


class ArithTask(vf.Task[ArithData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, task: ArithData, trace: vf.Trace) -> float:
        return float(parsed_answer(trace.last_reply) == task.answer)

    @vf.metric
    async def bare_number(self, trace: vf.Trace) -> float:
        return float(re.fullmatch(r"\s*-?\d+\s*", trace.last_reply) is not None)


class ArithTasksetConfig(vf.TasksetConfig):
    n: int = 600
    seed: int = 0
    max_value: int = 20


class ArithTaskset(vf.Taskset[ArithTask, ArithTasksetConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for _ in range(self.config.n):
            a, b = (rng.randint(1, self.config.max_value) for _ in range(2))
            op = rng.choice("+-")
            a, b = (max(a, b), min(a, b)) if op == "-" else (a, b)
            yield ArithTask(
                ArithData(
                    prompt=f"What is {a} {op} {b}? Answer with just the number.",
                    answer=str(a + b if op == "+" else a - b),
                    system_prompt="You are a careful calculator. Reply with only the final number.",
                )
            )


__all__ = ["ArithTaskset"]
