"""Held-out evaluation: one greedy rollout per scenario, accuracy from the reward's `correct`."""

from __future__ import annotations

from collections.abc import Sequence

import art
from pydantic import BaseModel, ConfigDict

from art_rlvr.observe import tracing
from art_rlvr.outcome import is_correct
from art_rlvr.records import RolloutsFailed
from art_rlvr.rollouts import SamplingConfig, rollout
from art_rlvr.scenario import Scenario


def describe(error: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


class EvalReport(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    split: str
    n: int
    accuracy: float
    mean_reward: float
    format_rate: float
    mean_completion_tokens: float
    errors: int
    first_error: str | None = None  # the first failed rollout's cause, when some failed
    groups: list[art.TrajectoryGroup]

    @property
    def error_rate(self) -> float:
        return self.errors / self.n

    def line(self) -> str:
        return (
            f"{self.split}: accuracy {self.accuracy:.3f} (n={self.n}), "
            f"reward {self.mean_reward:.3f}, "
            f"format {self.format_rate:.2f}, {self.mean_completion_tokens:.1f} tokens/completion"
            + (
                f", {self.errors} errored ({self.error_rate:.0%}; first: {self.first_error})"
                if self.errors
                else ""
            )
        )


@tracing.op("art_rlvr.evaluate", inputs=tracing.evaluate_inputs, output=tracing.evaluate_output)
async def evaluate(
    model: art.Model,
    scenarios: Sequence[Scenario],
    *,
    system_prompt: str | None = None,
    sampling: SamplingConfig = SamplingConfig(temperature=0.0),
    split: str = "val",
    step: int | None = None,
) -> EvalReport:
    if not scenarios:
        raise ValueError(f"no {split} scenarios to evaluate")
    results = await art.gather_trajectories(
        [
            rollout(model, sc, system_prompt=system_prompt, sampling=sampling, step=step)
            for sc in scenarios
        ],
        pbar_desc=f"eval {split}",
        max_exceptions=len(scenarios),
    )
    trajectories = [r for r in results if isinstance(r, art.Trajectory)]
    failures = [r for r in results if isinstance(r, BaseException)]
    n = len(scenarios)
    first_error = describe(failures[0]) if failures else None
    if not trajectories:
        raise RolloutsFailed(f"all {n} {split} rollouts failed; the first: {first_error}")

    def mean(key: str) -> float:
        return sum(float(t.metrics.get(key, 0.0)) for t in trajectories) / n

    return EvalReport(
        split=split,
        n=n,
        accuracy=sum(is_correct(t) for t in trajectories) / n,
        mean_reward=sum(t.reward for t in trajectories) / n,
        format_rate=mean("format"),
        mean_completion_tokens=mean("completion_tokens"),
        errors=len(failures),
        first_error=first_error,
        groups=[art.TrajectoryGroup(trajectories)],
    )
