"""Stopping and reward-hacking alarms, as pure functions of the evaluation and reward history.

"Watch your rollouts, don't blindly trust the reward": when the training reward climbs while
held-out accuracy falls, the policy is probably learning the reward's loopholes rather than the
task. That is worth a loud warning in the log and the report, not a silent curve.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict


class Alarm(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: str
    step: int
    message: str


def _window_mean(rewards: Mapping[int, float], lo: int, hi: int) -> float | None:
    """Mean train reward over steps in (lo, hi]."""
    values = [r for s, r in rewards.items() if lo < s <= hi]
    return statistics.fmean(values) if values else None


def reward_hacking(
    evals: Mapping[int, float],
    train_rewards: Mapping[int, float],
    *,
    min_rise: float,
    min_drop: float,
) -> Alarm | None:
    """An alarm at the latest evaluation if, since the one before it, val accuracy fell by at
    least `min_drop` while the mean train reward rose by at least `min_rise` against the
    equally long window before. Needs two evaluations and training before the earlier one."""
    steps = sorted(evals)
    if len(steps) < 2:
        return None
    prev, now = steps[-2], steps[-1]
    before = _window_mean(train_rewards, prev - (now - prev), prev)
    after = _window_mean(train_rewards, prev, now)
    if before is None or after is None:
        return None
    rise, drop = after - before, evals[prev] - evals[now]
    if rise < min_rise or drop < min_drop:
        return None
    return Alarm(
        kind="reward_hacking",
        step=now,
        message=(
            f"possible reward hacking: train reward rose {before:.3f} -> {after:.3f} over steps "
            f"{prev + 1}-{now} while val accuracy fell {evals[prev]:.3f} -> {evals[now]:.3f}; "
            "read the latest trajectories before trusting the reward"
        ),
    )


def plateaued(evals: Mapping[int, float], patience: int, min_delta: float = 0.0) -> Alarm | None:
    """Early stop when none of the last `patience` evaluations beat the best one before them
    by more than `min_delta`."""
    steps = sorted(evals)
    if len(steps) <= patience:
        return None
    best_before = max(evals[s] for s in steps[:-patience])
    recent = [evals[s] for s in steps[-patience:]]
    if max(recent) > best_before + min_delta:
        return None
    return Alarm(
        kind="early_stop",
        step=steps[-1],
        message=(
            f"val accuracy has not improved on {best_before:.3f} for {patience} evaluations "
            f"({', '.join(f'{v:.3f}' for v in recent)}); stopping early"
        ),
    )
