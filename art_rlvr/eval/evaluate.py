"""Held-out evaluation: one greedy rollout per scenario, accuracy from the reward's `correct`;
the unbiased pass@k and pass^k of n samples per item, and their report (`mode=eval` samples
them resumably: art_rlvr.eval.journal)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import art
from pydantic import BaseModel, ConfigDict, Field

from art_rlvr.core.outcome import is_correct
from art_rlvr.observe import tracing
from art_rlvr.rollouts.functions import RolloutFunctionError, rollout_failure
from art_rlvr.rollouts.rollout import rollout
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.rundir.events import RolloutsFailed
from art_rlvr.scenarios.scenario import Example


def describe(error: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def failure_of(result: art.Trajectory | BaseException) -> art.Trajectory | BaseException:
    """A rollout function's failure as the error it is (an evaluation counts it and re-runs
    it, as it does a rollout that raised), anything else as it is."""
    if isinstance(result, art.Trajectory) and (reason := rollout_failure(result)):
        return RolloutFunctionError(reason)
    return result


class EvalReport(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    split: str
    n: int
    accuracy: float
    mean_reward: float
    format_rate: float | None  # None: the reward reports no `format` metric
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
            + (f"format {self.format_rate:.2f}, " if self.format_rate is not None else "")
            + f"{self.mean_completion_tokens:.1f} tokens/completion"
            + (
                f", {self.errors} errored ({self.error_rate:.0%}; first: {self.first_error})"
                if self.errors
                else ""
            )
        )


@tracing.op("art_rlvr.evaluate", inputs=tracing.evaluate_inputs, output=tracing.evaluate_output)
async def evaluate(
    model: art.Model,
    examples: Sequence[Example],
    *,
    system_prompt: str | None = None,
    sampling: SamplingConfig = SamplingConfig(temperature=0.0),
    split: str = "val",
    step: int | None = None,
) -> EvalReport:
    if not examples:
        raise ValueError(f"no {split} scenarios to evaluate")
    results = await art.gather_trajectories(
        [
            rollout(model, sc, system_prompt=system_prompt, sampling=sampling, step=step)
            for sc in examples
        ],
        pbar_desc=f"eval {split}",
        max_exceptions=len(examples),
    )
    results = [failure_of(r) for r in results]
    trajectories = [r for r in results if isinstance(r, art.Trajectory)]
    failures = [r for r in results if isinstance(r, BaseException)]
    n = len(examples)
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
        format_rate=mean("format") if any("format" in t.metrics for t in trajectories) else None,
        mean_completion_tokens=mean("completion_tokens"),
        errors=len(failures),
        first_error=first_error,
        groups=[art.TrajectoryGroup(trajectories)],
    )


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one item with `c` correct of `n` samples (Chen et al. 2021):
    1 - C(n-c, k) / C(n, k), the chance that k of the n samples drawn without replacement
    hold at least one correct one."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_all_k(n: int, c: int, k: int) -> float:
    """The unbiased pass^k of one item (tau-bench's consistency measure, vf-eval's
    `pass_all_k`): C(c, k) / C(n, k), the chance that k of the n samples drawn without
    replacement are all correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass^k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return math.comb(c, k) / math.comb(n, k)


def mean_pass_at_k(correct: Sequence[int], n: int, k: int) -> float:
    """pass@k over items, each with its count of correct samples."""
    return sum(pass_at_k(n, c, k) for c in correct) / len(correct)


def mean_pass_all_k(correct: Sequence[int], n: int, k: int) -> float:
    """pass^k over items, each with its count of correct samples."""
    return sum(pass_all_k(n, c, k) for c in correct) / len(correct)


class SampledReport(BaseModel):
    """n rollouts per scenario: pass@k and pass^k for each k asked, tokens, and what errored
    (an errored sample counts as wrong)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    split: str
    items: int
    samples: int
    pass_at: dict[int, float]
    pass_all: dict[int, float] = Field(default_factory=dict)  # pass^k
    mean_reward: float
    format_rate: float | None
    completion_tokens: int
    errors: int
    first_error: str | None = None
    groups: list[art.TrajectoryGroup]

    @property
    def mean_completion_tokens(self) -> float:
        done = self.items * self.samples - self.errors
        return self.completion_tokens / done if done else 0.0

    def line(self) -> str:
        if self.samples == 1:  # one reply per item: what a greedy evaluation reports
            return (
                f"{self.split}: accuracy {self.pass_at[1]:.3f} (n={self.items}), "
                f"reward {self.mean_reward:.3f}, "
                + (f"format {self.format_rate:.2f}, " if self.format_rate is not None else "")
                + f"{self.mean_completion_tokens:.1f} tokens/completion"
                + (f", {self.errors} errored (first: {self.first_error})" if self.errors else "")
            )
        passes = ", ".join(
            [f"pass@{k} {v:.3f}" for k, v in sorted(self.pass_at.items())]
            + [f"pass^{k} {v:.3f}" for k, v in sorted(self.pass_all.items()) if k > 1]
        )
        return (
            f"{self.split}: {passes} ({self.items} items x {self.samples} samples), "
            f"reward {self.mean_reward:.3f}, {self.mean_completion_tokens:.1f} tokens/completion"
            + (f", {self.errors} errored (first: {self.first_error})" if self.errors else "")
        )
