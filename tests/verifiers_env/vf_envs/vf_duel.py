"""A two-seat env on an infinite taskset, shaped as verifiers 0.4's multi-agent tasksets are:
seats named `player0` and `player1` (no `agent`), a hand per task generated forever, and a
zero-sum payoff of +/- `stake` chips recorded on each seat's trace. Each seat is asked once for
the hand's number; a seat whose reply holds it and whose opponent's does not wins the stake."""

from itertools import count

import verifiers.v1 as vf


class DuelData(vf.TaskData):
    info: dict


class DuelTask(vf.Task[DuelData]):
    pass


class DuelEnvConfig(vf.EnvConfig):
    player0: vf.AgentConfig = vf.AgentConfig()
    player1: vf.AgentConfig = vf.AgentConfig()
    stake: float = 2.0


class DuelEnv(vf.Env[DuelEnvConfig]):
    async def run(self, task, agents):
        number = str(task.data.info["number"])
        seats = [
            vf.Task(
                vf.TaskData(idx=task.data.idx, prompt=None, system_prompt=f"You are player {i}.")
            )
            for i in (0, 1)
        ]
        async with (
            agents.player0.interaction(seats[0]) as first,
            agents.player1.interaction(seats[1]) as second,
        ):
            replies = [
                (await chat.turn(f"Say the number {number}.")).last_reply or ""
                for chat in (first, second)
            ]
        hits = [number in reply for reply in replies]
        net0 = self.config.stake * (hits[0] - hits[1])
        for i, chat in enumerate((first, second)):
            chat.trace.record_reward("payoff", net0 if i == 0 else -net0)


class DuelTaskset(vf.Taskset[DuelTask, vf.TasksetConfig]):
    INFINITE = True

    def load(self):
        for i in count():
            yield DuelTask(DuelData(idx=i, name=f"hand#{i}", prompt=None, info={"number": i}))


__all__ = ["DuelEnv", "DuelTaskset"]
