"""The rl phase: sample a batch of scenarios, N rollouts each, train, log; alone (`mode=rl`),
evaluate on val every `eval_every` steps.

Resumable by construction: the model's checkpoint step *is* the number of finished batches,
the batch at step b is a pure function of (seed, b), and evaluations are recorded in the state
by step. Each step is staged, committed and booked through the phase's `Ledger`, so a killed
run re-run in the same folder continues at the first unfinished step.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import art

from art_rlvr.core.text import prompt_hash
from art_rlvr.core.types import LrSchedule
from art_rlvr.loops.context import RunContext, clocks, eval_due, group_metrics, run_eval
from art_rlvr.loops.phase import Ledger, PhaseRun, Summary
from art_rlvr.loops.plan import PhaseKind
from art_rlvr.loops.state import PendingBatch, RunState, TrainState
from art_rlvr.observe import tracing
from art_rlvr.observe.alarms import plateaued, reward_hacking
from art_rlvr.rollouts.functions import trainable
from art_rlvr.rollouts.rollout import gather_groups
from art_rlvr.rollouts.sampling import SamplingConfig, rollout_seed
from art_rlvr.rundir.events import AlarmEvent, TrainEvent
from art_rlvr.rundir.stored import read_groups

log = logging.getLogger(__name__)


@dataclass
class StepOutcome:
    groups: list[art.TrajectoryGroup]
    stats: dict[str, float]
    result: art.TrainResult  # .step, .metrics


def _step_inputs(inputs: Mapping[str, object]) -> dict[str, object]:
    system = inputs.get("system_prompt")
    return {
        "step": inputs.get("step"),
        "system_prompt": system,
        "prompt_hash": prompt_hash(system) if isinstance(system, str) else None,
    }


def _step_output(outcome: StepOutcome) -> dict[str, object]:
    return {"step": outcome.result.step, **outcome.stats, "train": outcome.result.metrics}


@tracing.op("art_rlvr.rl_step", inputs=_step_inputs, output=_step_output)
async def rl_step(
    ctx: RunContext,
    step: int,
    *,
    system_prompt: str | None,
    sampling: SamplingConfig,
    learning_rate: float,
    before_train: Callable[[list[art.TrajectoryGroup], dict[str, float]], None] | None = None,
) -> StepOutcome:
    """One GRPO step: the batch for `step` (a pure function of seed and step), its groups of
    rollouts, and the backend's training call on them at `learning_rate` (`before_train` sees
    the groups first, so a run can save them before the checkpoint exists)."""
    cfg = ctx.config
    examples = ctx.scenario.train_batch(cfg.rl.groups_per_batch, cfg.seed, step)
    groups = await gather_groups(
        ctx.model,
        examples,
        cfg.group_size,
        system_prompt=system_prompt,
        sampling=sampling,
        seed=rollout_seed(cfg.seed, step),
        max_exceptions=cfg.max_exceptions,
        description=f"batch {step}",
    )
    stats = group_metrics(groups)
    if before_train is not None:
        before_train(groups, stats)
    result = await ctx.backend.train(
        ctx.model,
        trainable(groups),
        learning_rate=learning_rate,
        loss_fn=cfg.rl.loss_fn,
        kl_penalty_coef=cfg.rl.kl_penalty_coef,
        scale_rewards=cfg.rl.scale_rewards,
    )
    return StepOutcome(groups, stats, result)


async def train_until[S: TrainState](
    ctx: RunContext,
    state: S,
    *,
    until: int,
    system_prompt: str | None,
    eval_at: Callable[[int], bool],
    ledger: Ledger[S] | None = None,
) -> S:
    """RL steps from the model's current step up to `until` under a fixed `system_prompt`,
    with a val evaluation at each step where `eval_at(step)` (once: recorded in `state`).

    The batch at step b is a pure function of (seed, b) and the checkpoint step is the number
    of finished batches, so a killed run resumes here without losing or repeating a step.
    `state` (evals, rollouts, tokens trained, step seconds) goes through `ledger` (default:
    `state.json`) after every step: staged before it trains, committed once it has, booked."""
    cfg = ctx.config
    books: Ledger[S] = ledger or Ledger(ctx, lambda state: ctx.files.write_state(STATE, state))
    step = await ctx.model.get_step()
    sampling = SamplingConfig(
        max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p
    )
    if state.pending is not None:
        state = await recover_pending(ctx, state, state.pending, step, books)

    def stage(groups: list[art.TrajectoryGroup], stats: dict[str, float]) -> None:
        ctx.files.write_trajectories(PENDING, groups)
        pending = PendingBatch(from_step=step, stats=stats)
        books.stage(state.model_copy(update={"pending": pending}))

    while True:
        if eval_at(step) and str(step) not in state.evals:
            report = await run_eval(ctx, step, system_prompt=system_prompt)
            state = state.model_copy(update={"evals": {**state.evals, str(step): report.accuracy}})
            state = raise_alarms(ctx, state, step)
            books.save(state)
        if state.early_stop or step >= until:
            return state
        began = time.monotonic()
        done = await rl_step(
            ctx,
            step,
            system_prompt=system_prompt,
            sampling=sampling,
            learning_rate=scheduled_lr(
                cfg.rl.learning_rate, cfg.rl.lr_schedule, len(state.step_seconds), cfg.rl_steps
            ),
            before_train=stage,
        )
        groups, stats, result = done.groups, done.stats, done.result
        seconds = time.monotonic() - began
        landed = PendingBatch(
            from_step=step,
            stats=stats,
            landed_step=result.step,
            train_metrics=result.metrics,
            seconds=seconds,
        )
        books.commit(state.model_copy(update={"pending": landed}))
        step = result.step
        state = await book_step(ctx, state, step, landed, groups, books)
        log.info(
            "step %d/%d reward %.3f acc %.3f groups mixed %.2f all-correct %.2f all-wrong %.2f "
            "loss %s %.1fs, ETA %s",
            step,
            until,
            stats.get("reward_mean", 0),
            stats.get("accuracy", 0),
            stats.get("frac_mixed", 0),
            stats.get("frac_all_correct", 0),
            stats.get("frac_all_wrong", 0),
            shown_loss(result.metrics),
            seconds,
            eta(state.step_seconds, until - step),
        )


def shown_loss(metrics: dict[str, float]) -> str:
    """The step's loss as the log shows it; `n/a` where the backend reports none (Tinker's
    native backend reports grad_norm but no loss), rather than a 0 that reads as trained out."""
    return f"{metrics['loss']:.4f}" if "loss" in metrics else "n/a"


def scheduled_lr(base: float, schedule: LrSchedule, done: int, total: int) -> float:
    """The learning rate of a run's RL step `done` (0-based) of `total`: TRL's and
    tinker-cookbook's schedules, with no warm-up: the last step trains at `base / total`
    (linear), never at 0. A pure function of the count of RL steps booked, so a resumed run
    trains each step at the rate it would have had."""
    progress = min(done, total - 1) / total if total > 0 else 0.0
    match schedule:
        case "constant":
            return base
        case "linear":
            return base * (1.0 - progress)
        case "cosine":
            return base * 0.5 * (1.0 + math.cos(math.pi * progress))


STATE = "state.json"
PENDING = "train_pending"  # the batch being trained: its trajectories, until the step lands


async def book_step[S: TrainState](
    ctx: RunContext,
    state: S,
    step: int,
    pending: PendingBatch,
    groups: Sequence[art.TrajectoryGroup],
    ledger: Ledger[S],
) -> S:
    """Book a step whose checkpoint landed: ART's log of its batch (once: `log_once`), its
    metrics line (once), its trajectories, then the state without the pending batch. Each
    write is atomic or rolled back, so a kill anywhere here is redone by the resume whole."""
    train_metrics = pending.train_metrics or {}
    await ctx.files.log_once(
        ctx.model, f"train/{step}", list(groups), metrics=train_metrics, step=step, split="train"
    )
    return record_step(ctx, state, step, pending, ledger)


def record_step[S: TrainState](
    ctx: RunContext, state: S, step: int, pending: PendingBatch, ledger: Ledger[S]
) -> S:
    """Book a finished step in the run folder: its trajectories, its metrics line (once), then
    the state without the pending batch. The order makes a repeat after a kill a no-op."""
    stats, seconds = pending.stats, pending.seconds
    train_metrics = pending.train_metrics or {}
    event = TrainEvent.model_validate(  # the batch's stats and `train/*` are open-ended: a dict
        {
            "step": step,
            **stats,
            **{f"train/{k}": v for k, v in train_metrics.items()},
            "seconds": seconds,
            **clocks(ctx),
        }
    )
    saved = ctx.files.root / "trajectories" / f"{PENDING}.jsonl"
    if saved.exists():
        saved.replace(saved.with_name(f"train_{step:04d}.jsonl"))
    state = state.model_copy(
        update={
            "pending": None,
            "tokens_trained": state.tokens_trained + trained_tokens(train_metrics),
            "recovered_steps": state.recovered_steps
            + ([step] if stats.get("recovered_after_kill") else []),
            "rollouts": state.rollouts + int(stats.get("trajectories", 0)),
            "step_seconds": [*state.step_seconds, round(seconds, 3)],
            "train_rewards": {**state.train_rewards, str(step): stats.get("reward_mean", 0.0)},
        }
    )
    return ledger.book(state, event)  # once: a step booked before a kill is not booked again


async def recover_pending[S: TrainState](
    ctx: RunContext, state: S, pending: PendingBatch, step: int, ledger: Ledger[S]
) -> S:
    """A kill came while a batch was being trained or booked. If its checkpoint landed, book
    the step from the saved batch (with the backend's metrics if they were saved; if the kill
    came between the checkpoint and that save, they are lost, and the record says so); if
    not, forget it: the batch is a pure function of (seed, step) and is drawn again."""
    if step <= pending.from_step:
        log.info("resuming: the batch for step %d had not trained; drawing it again", step + 1)
        return state.model_copy(update={"pending": None})
    folder = ctx.files.root / "trajectories"
    saved = [p for p in (folder / f"{PENDING}.jsonl", folder / f"train_{step:04d}.jsonl")
             if p.exists()]  # fmt: skip
    groups = [g.to_art() for g in read_groups(saved[0])] if saved else []
    if pending.train_metrics is None:
        log.warning(
            "resuming: step %d had trained before the kill; booking it from its saved batch "
            "(its loss and token count are lost)",
            step,
        )
        pending = pending.model_copy(
            update={"stats": {**pending.stats, "recovered_after_kill": 1.0}, "train_metrics": {}}
        )
    else:
        log.info("resuming: booking step %d, which had trained before the kill", step)
    return await book_step(ctx, state, step, pending, groups, ledger)


def eta(step_seconds: Sequence[float], remaining: int) -> str:
    """Time left at the median step time so far (evaluations not included)."""
    if remaining <= 0 or not step_seconds:
        return "0s"
    seconds = int(statistics.median(step_seconds[-8:]) * remaining)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def raise_alarms[S: TrainState](ctx: RunContext, state: S, step: int) -> S:
    """After an evaluation: warn on reward hacking; with `patience`, decide an early stop.
    Both land in the log, metrics.jsonl (for the report) and state.json (once each)."""
    cfg = ctx.config
    evals = {int(s): a for s, a in state.evals.items()}
    rewards = {int(s): r for s, r in state.train_rewards.items()}
    found = [
        reward_hacking(
            evals, rewards, min_rise=cfg.rl.alarm_reward_rise, min_drop=cfg.rl.alarm_val_drop
        )
    ]
    if cfg.rl.patience is not None and len(cfg.plan) == 1:  # an rl phase alone (mode=rl)
        found.append(plateaued(evals, cfg.rl.patience, cfg.rl.min_delta))
    for alarm in (a for a in found if a is not None):
        if alarm.kind == "early_stop":
            log.warning("step %d: %s", step, alarm.message)
            state = state.model_copy(update={"early_stop": alarm.model_dump()})
            ctx.files.append_event(AlarmEvent(event="early_stop", **alarm.model_dump()))
        else:
            log.warning("!!! step %d: %s", step, alarm.message)
            state = state.model_copy(update={"alarms": [*state.alarms, alarm.model_dump()]})
            ctx.files.append_event(AlarmEvent(event="alarm", **alarm.model_dump()))
    return state


def spend(state: TrainState) -> Summary:
    """What the training so far cost, for summary.json; steps whose training metrics a kill
    lost are named, since `training_tokens` cannot count them."""
    seconds = state.step_seconds
    return {
        "rollouts": state.rollouts,
        "training_tokens": state.tokens_trained,
        "seconds_per_step_median": statistics.median(seconds) if seconds else None,
        **({"recovered_steps": state.recovered_steps} if state.recovered_steps else {}),
    }


class RLPhase:
    """The rl phase: `entry.count` RL steps from the step it began at, under the run's `s`;
    alone (`mode=rl`: `rl:<n_batches>`) evaluated every `eval_every` steps."""

    kind: ClassVar[PhaseKind] = "rl"
    journaled: ClassVar[bool] = False
    state_model = TrainState
    what = "an RL run's"

    async def fresh(self, run: PhaseRun[TrainState]) -> TrainState:
        return TrainState()

    def part(self, state: RunState) -> TrainState:
        return state.rl

    async def run(self, run: PhaseRun[TrainState], state: TrainState) -> TrainState:
        ctx, every = run.ctx, run.ctx.config.rl.eval_every
        until = run.start_step + run.entry.count
        if run.alone:
            step = await ctx.model.get_step()
            if step > until:
                raise RuntimeError(
                    f"{ctx.files.root} is at step {step}, past the phase's {until} steps"
                )
            if step:
                log.info("resuming at step %d of %d", step, until)
        return await train_until(
            ctx,
            state,
            until=until,
            system_prompt=run.prompt,
            eval_at=(lambda s: eval_due(s, until, every)) if run.alone else (lambda _: False),
            ledger=run.ledger,
        )

    def settled(self, state: TrainState) -> TrainState:
        return state.model_copy(update={"pending": None})

    def measured(self, state: TrainState) -> float | None:
        return None

    async def summary(self, run: PhaseRun[TrainState], state: TrainState) -> Summary:
        ctx, evals = run.ctx, state.evals
        step = await ctx.model.get_step()
        summary: Summary = {
            "val_accuracy_before": evals.get("0"),
            "val_accuracy_after": evals.get(str(step)),
            "steps": step,
            **spend(state),
            "alarms": state.alarms,
        }
        if state.early_stop:
            summary["early_stop"] = state.early_stop
        if ctx.config.eval_test and ctx.scenario.splits["test"]:
            summary["test_accuracy_after"] = (await run_eval(ctx, step, split="test")).accuracy
        return summary


def trained_tokens(metrics: dict[str, float]) -> int:
    """A step's trained tokens: TorchBackend's `tokens`, or ART's own backends' name for them."""
    return int(metrics.get("tokens", metrics.get("data/step_trainable_assistant_tokens", 0)))
