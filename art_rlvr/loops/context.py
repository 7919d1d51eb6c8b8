"""What every loop shares: the run context, held-out evaluation at a step, batch statistics.

Every mode's loop (RL, GEPA, EI, the schedule) builds on this module, not on another loop.
"""

from __future__ import annotations

import logging
import resource
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict, Unpack

import art

from art_rlvr.core.outcome import is_correct
from art_rlvr.eval.evaluate import EvalReport, SampledReport, evaluate
from art_rlvr.observe.clock import cpu_seconds
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.rundir.events import EvalEvent, episode_means
from art_rlvr.rundir.files import RunFiles
from art_rlvr.scenarios.mixture import Mixture
from art_rlvr.scenarios.scenario import Example, Scenario

if TYPE_CHECKING:
    from art_rlvr.config.run_config import RunConfig

log = logging.getLogger(__name__)


@dataclass
class RunContext:
    config: RunConfig
    scenario: Scenario | Mixture
    backend: art.Backend
    model: art.TrainableModel
    files: RunFiles
    started: float  # time.monotonic() at the start of this session
    cpu_started: float = 0.0  # cpu_seconds() then; metrics events carry both clocks


def one_scenario(ctx: RunContext, phase: str) -> Scenario:
    """The run's scenario for a phase that runs on one (GEPA, EI): `RunConfig` refuses a
    mixture for them, so reaching here with one is a caller's mistake, said plainly."""
    if isinstance(ctx.scenario, Mixture):
        raise ValueError(f"{phase} runs on one scenario, not the mixture {ctx.scenario.name}")
    return ctx.scenario


def eval_due(index: int, last: int, every: int) -> bool:
    """Evaluate at the start, at the end, and every `every` steps (or rounds) between."""
    return index == 0 or index == last or index % every == 0


class Clocks(TypedDict):
    wall_seconds: float
    cpu_seconds: float


def clocks(ctx: RunContext) -> Clocks:
    """The two clocks every timed event carries: since this session started, wall and CPU."""
    return {
        "wall_seconds": time.monotonic() - ctx.started,
        "cpu_seconds": cpu_seconds() - ctx.cpu_started,
    }


def group_metrics(groups: Sequence[art.TrajectoryGroup]) -> dict[str, float]:
    """Reward stats and the all-correct / all-wrong / mixed split (by `is_correct`, the one
    rule: a retry solved on its second try is correct at reward 0.5) that says where signal is."""
    rewards = [t.reward for g in groups for t in g.trajectories]
    if not rewards:
        return {"trajectories": 0.0}
    verdicts = [[is_correct(t) for t in g.trajectories] for g in groups if g.trajectories]
    kinds = ["all_correct" if all(v) else "all_wrong" if not any(v) else "mixed" for v in verdicts]
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
        **episode_means(t.metrics for t in trajectories),
    }


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def val_examples(ctx: RunContext) -> list[Example]:
    return ctx.scenario.held_out("val", ctx.config.val_limit)


def by_scenario(
    examples: Sequence[Example], groups: Sequence[art.TrajectoryGroup], samples: int = 1
) -> dict[str, float]:
    """A mixture's accuracy (pass@1) per scenario, errored rollouts counted wrong; {} for one
    scenario. Rollouts name their scenario in `metadata["task"]`."""
    counts = Counter(s.scenario.name for s in examples)
    if len(counts) < 2:
        return {}
    correct = Counter(
        t.metadata.get("task") for g in groups for t in g.trajectories if is_correct(t)
    )
    return {name: correct[name] / (n * samples) for name, n in counts.items()}


class EvalExtra(TypedDict, total=False):
    """What an evaluation's event carries beside its report: clocks, round, policy, cost."""

    wall_seconds: float
    cpu_seconds: float
    round: int | None
    policy: str | None
    cost_usd: float | None
    pass_all: dict[int, float]


def eval_event(
    report: EvalReport | SampledReport,
    step: int,
    *,
    accuracies: dict[str, float],
    tag: str = "",
    **extra: Unpack[EvalExtra],
) -> EvalEvent:
    """The metrics line of an evaluation, greedy or sampled (`extra`: clocks, policy, cost).
    A mixture's accuracy is the mean of its scenarios' (each scenario weighs the same)."""
    if isinstance(report, SampledReport):
        pooled, samples, pass_at = report.pass_at[1], report.samples, report.pass_at
        completion_tokens: int | None = report.completion_tokens
    else:  # greedy: one reply per item, the event's defaults
        pooled, samples, pass_at, completion_tokens = report.accuracy, 1, {}, None
    return EvalEvent(
        split=report.split,
        step=step,
        accuracy=statistics.fmean(accuracies.values()) if accuracies else pooled,
        reward_mean=report.mean_reward,
        format=report.format_rate or 0.0,
        tokens_per_completion=report.mean_completion_tokens,
        errors=report.errors,
        first_error=report.first_error,
        tag=tag,
        by_scenario=accuracies,
        samples=samples,
        pass_at=pass_at,
        completion_tokens=completion_tokens,
        **extra,
    )


async def run_eval(
    ctx: RunContext,
    step: int,
    split: str = "val",
    *,
    system_prompt: str | None = None,
    tag: str = "",
    round: int | None = None,
) -> EvalReport:
    """Greedy evaluation of the model at `step` under `system_prompt` (default: the run's);
    logged to metrics.jsonl, trajectories/<split>_<step><tag>.jsonl (mode=ei: the `round`
    instead of the step) and ART's history at `step`. A mixture's report carries the mean of
    its scenarios' accuracies (each one is in the event)."""
    cfg = ctx.config
    examples = val_examples(ctx) if split == "val" else ctx.scenario.held_out(split)
    prompt = system_prompt if system_prompt is not None else cfg.system_prompt
    report = await evaluate(
        ctx.model,
        examples,
        system_prompt=prompt,
        sampling=SamplingConfig(max_tokens=cfg.max_tokens, temperature=cfg.eval_temperature),
        split=split,
    )
    event = eval_event(
        report,
        step,
        accuracies=by_scenario(examples, report.groups),
        tag=tag,
        round=round,
        **clocks(ctx),
    )
    report = report.model_copy(update={"accuracy": event.accuracy})
    where = f"step {step}" if round is None else f"round {round} (step {step})"
    log.info("%s %s%s", where, report.line(), scenario_line(event.by_scenario))
    ctx.files.append_event(event)
    ctx.files.write_trajectories(f"{split}_{event.index:04d}{tag}", report.groups)
    # ART's history (and W&B if set), once per evaluation however often a kill makes it redone
    await ctx.files.log_once(
        ctx.model, f"{split}/{event.index}{tag}", report.groups, split=split, step=step
    )
    return report


def scenario_line(accuracies: dict[str, float]) -> str:
    """`; by scenario: arith 0.550, gsm8k 0.100` (nothing for one scenario)."""
    if not accuracies:
        return ""
    return "; by scenario: " + ", ".join(f"{n} {a:.3f}" for n, a in accuracies.items())
