"""A taskset whose rubric raises on one task (answer "BOOM") and whose weights sum to 1.5."""

import verifiers.v1 as vf


class BoomData(vf.TaskData):
    answer: str = ""


class BoomTask(vf.Task[BoomData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def replied(self, trace: vf.Trace) -> float:
        return float(bool(trace.last_reply.strip()))

    @vf.reward(weight=0.5)
    async def boom(self, task: BoomData) -> float:
        if task.answer == "BOOM":
            raise RuntimeError("rubric exploded")
        return 1.0 if task.answer == "over" else 0.0


class BoomTaskset(vf.Taskset[BoomTask, vf.TasksetConfig]):
    def load(self):
        for answer in ("BOOM", "fine", "over", "BOOM"):
            yield BoomTask(BoomData(prompt=f"Say {answer}.", answer=answer))


__all__ = ["BoomTaskset"]
