"""What every loop shares: the run context, held-out evaluation at a step, batch statistics.

Every mode's loop (RL, GEPA, EI, the schedule) builds on this module, not on another loop.
"""

from __future__ import annotations

import logging
import resource
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import art

from art_rlvr.evaluation import EvalReport, evaluate
from art_rlvr.observe.clock import cpu_seconds
from art_rlvr.outcome import is_correct
from art_rlvr.records import EvalEvent
from art_rlvr.rollouts import SamplingConfig
from art_rlvr.runfiles import RunFiles
from art_rlvr.scenario import Scenario, Task

if TYPE_CHECKING:
    from art_rlvr.config import RunConfig

log = logging.getLogger(__name__)


@dataclass
class RunContext:
    config: RunConfig
    task: Task
    backend: art.Backend
    model: art.TrainableModel
    files: RunFiles
    started: float  # time.monotonic() at the start of this session
    cpu_started: float = 0.0  # cpu_seconds() then; metrics events carry both clocks


def eval_due(index: int, last: int, every: int) -> bool:
    """Evaluate at the start, at the end, and every `every` steps (or rounds) between."""
    return index == 0 or index == last or index % every == 0


def clocks(ctx: RunContext) -> dict[str, float]:
    """The two clocks every timed event carries: since this session started, wall and CPU."""
    return {
        "wall_seconds": time.monotonic() - ctx.started,
        "cpu_seconds": cpu_seconds() - ctx.cpu_started,
    }


def group_metrics(groups: Sequence[art.TrajectoryGroup]) -> dict[str, float]:
    """Reward stats and the all-correct / all-wrong / mixed split that says where signal is."""
    rewards = [t.reward for g in groups for t in g.trajectories]
    if not rewards:
        return {"trajectories": 0.0}
    kinds = [
        "all_correct"
        if all(t.reward >= 1 for t in g.trajectories)
        else "all_wrong"
        if all(t.reward <= 0 for t in g.trajectories)
        else "mixed"
        for g in groups
        if g.trajectories
    ]
    trajectories = [t for g in groups for t in g.trajectories]
    return {
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards),
        "accuracy": statistics.fmean(float(is_correct(t)) for t in trajectories),
        "format": statistics.fmean(float(t.metrics.get("format", 0.0)) for t in trajectories),
        "tokens_per_completion": statistics.fmean(
            float(t.metrics.get("completion_tokens", 0)) for t in trajectories
        ),
        "frac_all_correct": kinds.count("all_correct") / len(kinds),
        "frac_all_wrong": kinds.count("all_wrong") / len(kinds),
        "frac_mixed": kinds.count("mixed") / len(kinds),
        "trajectories": float(len(trajectories)),
        "groups": float(len(kinds)),
    }


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def val_scenarios(ctx: RunContext) -> list[Scenario]:
    val = ctx.task.splits["val"]
    return val[: ctx.config.val_limit] if ctx.config.val_limit else val


async def run_eval(
    ctx: RunContext,
    step: int,
    split: str = "val",
    *,
    system_prompt: str | None = None,
    tag: str = "",
) -> EvalReport:
    """Greedy evaluation at `step` under `system_prompt` (default: the run's); logged to
    metrics.jsonl, trajectories/<split>_<step><tag>.jsonl and ART's history."""
    cfg = ctx.config
    scenarios = val_scenarios(ctx) if split == "val" else ctx.task.splits[split]
    prompt = system_prompt if system_prompt is not None else cfg.system_prompt
    report = await evaluate(
        ctx.model,
        scenarios,
        system_prompt=prompt,
        sampling=SamplingConfig(max_tokens=cfg.max_tokens, temperature=cfg.eval_temperature),
        split=split,
    )
    log.info("step %d %s", step, report.line())
    ctx.files.append_event(
        EvalEvent(
            split=split,
            step=step,
            accuracy=report.accuracy,
            reward_mean=report.mean_reward,
            format=report.format_rate,
            tokens_per_completion=report.mean_completion_tokens,
            errors=report.errors,
            first_error=report.first_error,
            tag=tag,
            **clocks(ctx),
        )
    )
    ctx.files.write_trajectories(f"{split}_{step:04d}{tag}", report.groups)
    await ctx.model.log(report.groups, split=split, step=step)  # ART's history (and W&B if set)
    return report
