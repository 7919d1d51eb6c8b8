"""Reward functions `R(x, y) -> Score`, one module per family, looked up by name."""

from pathlib import Path

from art_rlvr.scenarios.rewards.base import (
    RewardConfigError,
    RewardFactory,
    RewardFn,
    Score,
    build_reward,
)
from art_rlvr.scenarios.rewards.code import code
from art_rlvr.scenarios.rewards.math import math
from art_rlvr.scenarios.rewards.numeric import numeric
from art_rlvr.scenarios.rewards.qa import qa

REWARDS: dict[str, RewardFactory] = {"numeric": numeric, "math": math, "code": code, "qa": qa}


def make_reward(name: str, params: dict | None = None, near: Path | None = None) -> RewardFn:
    """A reward by built-in name or `module:function` (on the path, or a module in `near`)."""
    return build_reward(name, dict(params or {}), REWARDS, near)


__all__ = ["REWARDS", "RewardConfigError", "RewardFn", "Score", "make_reward"]
