"""Held-out evaluation: one greedy rollout per scenario, accuracy from the reward's `correct`;
or n sampled rollouts per scenario with pass@k (`evaluate_samples`), for any policy."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import art
from pydantic import BaseModel, ConfigDict

from art_rlvr.observe import tracing
from art_rlvr.outcome import is_correct
from art_rlvr.records import RolloutsFailed
from art_rlvr.rollouts import SamplingConfig, rollout, rollout_seed
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


def mean_pass_at_k(correct: Sequence[int], n: int, k: int) -> float:
    """pass@k over items, each with its count of correct samples."""
    return sum(pass_at_k(n, c, k) for c in correct) / len(correct)


class SampledReport(BaseModel):
    """n rollouts per scenario: pass@k for each k asked, tokens, and what errored (an errored
    sample counts as wrong)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    split: str
    items: int
    samples: int
    pass_at: dict[int, float]
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
        passes = ", ".join(f"pass@{k} {v:.3f}" for k, v in sorted(self.pass_at.items()))
        return (
            f"{self.split}: {passes} ({self.items} items x {self.samples} samples), "
            f"reward {self.mean_reward:.3f}, {self.mean_completion_tokens:.1f} tokens/completion"
            + (f", {self.errors} errored (first: {self.first_error})" if self.errors else "")
        )


async def evaluate_samples(
    model: Any,
    scenarios: Sequence[Scenario],
    *,
    samples: int,
    ks: Sequence[int],
    sampling: SamplingConfig,
    seed: int,
    system_prompt: str | None = None,
    split: str = "val",
    max_in_flight: int | None = None,
) -> SampledReport:
    """`samples` rollouts of each scenario (sample i seeded from (seed, scenario, i)) by any
    policy with rollout's surface (`art.Model` or `art_rlvr.policy.LiteLLMPolicy`)."""
    if not scenarios:
        raise ValueError(f"no {split} scenarios to evaluate")
    limiter = asyncio.Semaphore(max_in_flight) if max_in_flight else None
    coros = [
        rollout(
            model,
            sc,
            system_prompt=system_prompt,
            sampling=sampling.model_copy(update={"seed": rollout_seed(seed, sc.id, i)}),
            limiter=limiter,
        )
        for sc in scenarios
        for i in range(samples)
    ]
    results = await art.gather_trajectories(
        coros, pbar_desc=f"eval {split} x{samples}", max_exceptions=len(coros)
    )
    per_item = [results[i * samples : (i + 1) * samples] for i in range(len(scenarios))]
    trajectories = [r for r in results if isinstance(r, art.Trajectory)]
    failures = [r for r in results if isinstance(r, BaseException)]
    first_error = describe(failures[0]) if failures else None
    if not trajectories:
        raise RolloutsFailed(f"all {len(coros)} {split} rollouts failed; the first: {first_error}")
    correct = [sum(isinstance(t, art.Trajectory) and is_correct(t) for t in g) for g in per_item]
    total = len(coros)
    return SampledReport(
        split=split,
        items=len(scenarios),
        samples=samples,
        pass_at={k: mean_pass_at_k(correct, samples, k) for k in sorted({1, *ks})},
        mean_reward=sum(t.reward for t in trajectories) / total,
        format_rate=sum(float(t.metrics.get("format", 0.0)) for t in trajectories) / total
        if any("format" in t.metrics for t in trajectories)
        else None,
        completion_tokens=int(
            sum(float(t.metrics.get("completion_tokens", 0)) for t in trajectories)
        ),
        errors=len(failures),
        first_error=first_error,
        groups=[
            art.TrajectoryGroup(
                [t for t in g if isinstance(t, art.Trajectory)],
                metadata={"scenario_id": sc.id},
            )
            for sc, g in zip(scenarios, per_item, strict=True)
            if any(isinstance(t, art.Trajectory) for t in g)
        ],
    )
