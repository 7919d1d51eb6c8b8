"""The RL-only loop: sample a batch of scenarios, N rollouts each, train, log; evaluate on val.

Resumable by construction: the model's checkpoint step *is* the number of finished batches,
the batch at step b is a pure function of (seed, b), and evaluations are recorded in the state
file by step. A killed run re-run in the same folder continues at the first unfinished step.
"""

from __future__ import annotations

import logging
import random
import resource
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import art

from art_rlvr.loops.evaluate import EvalReport, evaluate
from art_rlvr.loops.files import RunFiles
from art_rlvr.rollouts import SamplingConfig, gather_groups, rollout_seed
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
    started: float


def batch_scenarios(pool: Sequence[Scenario], size: int, seed: int, batch: int) -> list[Scenario]:
    """Batch `batch` of an endless stream of seeded per-epoch shuffles of `pool`."""
    if not pool:
        raise ValueError("the train split is empty")
    out: list[Scenario] = []
    start = batch * size
    for position in range(start, start + size):
        epoch, index = divmod(position, len(pool))
        order = list(range(len(pool)))
        random.Random(f"order:{seed}:{epoch}").shuffle(order)
        out.append(pool[order[index]])
    return out


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
        "accuracy": statistics.fmean(
            float(t.metrics.get("correct", t.reward >= 1)) for t in trajectories
        ),
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


async def run_eval(ctx: RunContext, step: int, split: str = "val") -> EvalReport:
    cfg = ctx.config
    scenarios = val_scenarios(ctx) if split == "val" else ctx.task.splits[split]
    report = await evaluate(
        ctx.model,
        scenarios,
        system_prompt=cfg.system_prompt,
        sampling=SamplingConfig(max_tokens=cfg.max_tokens, temperature=cfg.eval_temperature),
        split=split,
    )
    log.info("step %d %s", step, report.line())
    ctx.files.append_metrics(
        {
            "event": "eval",
            "split": split,
            "step": step,
            "accuracy": report.accuracy,
            "reward_mean": report.mean_reward,
            "format": report.format_rate,
            "tokens_per_completion": report.mean_completion_tokens,
            "errors": report.errors,
            "wall_seconds": time.monotonic() - ctx.started,
        }
    )
    ctx.files.write_trajectories(f"{split}_{step:04d}", report.groups)
    await ctx.model.log(report.groups, split=split, step=step)  # ART's history (and W&B if set)
    return report


def eval_due(step: int, cfg: RunConfig) -> bool:
    return step == 0 or step == cfg.n_batches or step % cfg.eval_every == 0


async def run_rl(ctx: RunContext) -> dict[str, float | int | str | None]:
    cfg = ctx.config
    state = ctx.files.read_json("state.json") or {"evals": {}}
    step = await ctx.model.get_step()
    if step > cfg.n_batches:
        raise RuntimeError(f"{ctx.files.root} is at step {step}, past n_batches={cfg.n_batches}")
    if step:
        log.info("resuming at step %d of %d", step, cfg.n_batches)
    sampling = SamplingConfig(
        max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p
    )
    step_seconds: list[float] = []
    tokens_trained = int(state.get("tokens_trained", 0))
    rollouts = int(state.get("rollouts", 0))
    while True:
        if eval_due(step, cfg) and str(step) not in state["evals"]:
            report = await run_eval(ctx, step)
            state["evals"][str(step)] = report.accuracy
            ctx.files.write_json("state.json", state)
        if step >= cfg.n_batches:
            break
        began = time.monotonic()
        scenarios = batch_scenarios(ctx.task.splits["train"], cfg.groups_per_batch, cfg.seed, step)
        groups = await gather_groups(
            ctx.model,
            scenarios,
            cfg.group_size,
            system_prompt=cfg.system_prompt,
            sampling=sampling,
            seed=rollout_seed(cfg.seed, step),
            max_exceptions=cfg.max_exceptions,
            description=f"batch {step}",
        )
        stats = group_metrics(groups)
        result = await ctx.backend.train(
            ctx.model,
            groups,
            learning_rate=cfg.learning_rate,
            loss_fn=cfg.loss_fn,
            kl_penalty_coef=cfg.kl_penalty_coef,
            scale_rewards=cfg.scale_rewards,
        )
        step = result.step
        seconds = time.monotonic() - began
        step_seconds.append(seconds)
        tokens_trained += int(result.metrics.get("tokens", 0))
        rollouts += int(stats.get("trajectories", 0))
        state |= {"tokens_trained": tokens_trained, "rollouts": rollouts}
        ctx.files.write_json("state.json", state)
        ctx.files.append_metrics(
            {
                "event": "train",
                "step": step,
                **stats,
                **{f"train/{k}": v for k, v in result.metrics.items()},
                "seconds": seconds,
                "wall_seconds": time.monotonic() - ctx.started,
            }
        )
        ctx.files.write_trajectories(f"train_{step:04d}", groups)
        await ctx.model.log(groups, metrics=result.metrics, step=step, split="train")
        log.info(
            "step %d/%d reward %.3f acc %.3f groups mixed %.2f all-correct %.2f all-wrong %.2f "
            "loss %.4f %.1fs",
            step,
            cfg.n_batches,
            stats.get("reward_mean", 0),
            stats.get("accuracy", 0),
            stats.get("frac_mixed", 0),
            stats.get("frac_all_correct", 0),
            stats.get("frac_all_wrong", 0),
            result.metrics.get("loss", 0.0),
            seconds,
        )
    evals = state["evals"]
    summary: dict[str, float | int | str | None] = {
        "val_accuracy_before": evals.get("0"),
        "val_accuracy_after": evals.get(str(cfg.n_batches)),
        "steps": step,
        "rollouts": rollouts,
        "training_tokens": tokens_trained,
        "seconds_per_step_median": statistics.median(step_seconds) if step_seconds else None,
    }
    if cfg.eval_test and ctx.task.splits["test"]:
        summary["test_accuracy_after"] = (await run_eval(ctx, step, split="test")).accuracy
    return summary
