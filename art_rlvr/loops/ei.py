"""The ei phase of a run: rounds of sample -> select / hint -> relabel -> distil; alone
(`mode=ei`), with greedy val evaluations in between.

Alone, the run folder holds its state (`state.json`, an `EIState`; in a list, the `ei`
section of the list's state), every event goes to `metrics.jsonl`, trajectories to
`trajectories/` (`train_RRRR` clean attempts, `hinted_RRRR` hinted ones, `val_RRRR`
evaluations, where RRRR is the round), and each round's buffer (examples, hints, stats) to
`ei/round_RRRR.json`, hints also to `ei/hints.jsonl`.

Resume (the phase's `Ledger`): a round's buffer is staged in the state before it trains. A
run killed while sampling redoes that round (its rollouts are seeded); one killed while
training trains on the saved buffer, or, if the checkpoint of that training is already on
disk, only finishes the bookkeeping. Raising `rounds` and re-running continues a finished run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import ClassVar

from pydantic import JsonValue

from art_rlvr.core import text
from art_rlvr.ei.config import EIConfig, start_problem
from art_rlvr.ei.data import EIState, RoundBuffer
from art_rlvr.ei.expert import collect_round, distill_round
from art_rlvr.ei.files import write_round_records
from art_rlvr.ei.hints import make_teacher
from art_rlvr.llm.client import LLMClient, LLMCounters
from art_rlvr.loops.context import RunContext, clocks, eval_due, one_scenario, run_eval
from art_rlvr.loops.phase import PhaseRun, Summary
from art_rlvr.loops.plan import PhaseKind
from art_rlvr.loops.state import RunState
from art_rlvr.rundir.events import EIRoundEvent

log = logging.getLogger(__name__)

# knobs that may change between a run and its resume (they do not change what a round does)
_RESUMABLE = {
    "rounds",
    "eval_every_rounds",
    "log_excerpts",
    "hint_reliance",
    "teacher_concurrency",
}
# of the teacher's settings, only these change what a hint says
_TEACHER_SHAPING = {"model", "temperature", "max_tokens"}

_TOTALS = (
    "clean_attempts",
    "hinted_attempts",
    "clean_solved",
    "recovered",
    "hints_requested",
    "hints_generated",
    "hints_leak_rejected",
    "hints_dropped",
    "hinted_echo_rejected",
    "teacher_errors",
    "examples_distilled",
    "examples_from_hints",
    "rollout_errors",
)


def fingerprint(config: EIConfig, task_name: str, system_prompt: str | None) -> str:
    dumped = config.model_dump(mode="json")
    shaping = {k: v for k, v in dumped.items() if k not in _RESUMABLE}
    shaping["teacher"] = {k: v for k, v in dumped["teacher"].items() if k in _TEACHER_SHAPING}
    return text.fingerprint(shaping, task_name, system_prompt)


def check_records(ctx: RunContext, config: EIConfig) -> None:
    """Refuse what EI cannot run on before anything is spent (the CLI asked already)."""
    if problem := start_problem(
        config, one_scenario(ctx, "expert iteration"), ctx.config.system_prompt
    ):
        raise ValueError(problem)


def log_round(buffer: RoundBuffer, config: EIConfig, rounds: int) -> None:
    s = buffer.stats
    hinted = (
        f" | hints {s.hints_generated}/{s.hints_requested} (leak-rejected {s.hints_leak_rejected},"
        f" dropped {s.hints_dropped}, teacher errors {s.teacher_errors}), hinted solve "
        f"{s.hinted_solve_rate if s.hinted_solve_rate is not None else float('nan'):.2f}, "
        f"recovered {s.recovered}, reliance "
        + (f"{s.hint_reliance_mean:.2f} nats" if s.hint_reliance_mean is not None else "n/a")
        if config.enable_teacher_hints
        else ""
    )
    log.info(
        "round %d/%d: clean solve %.2f (attempt acc %.2f) | distilled %d (%d from hints)%s",
        buffer.round + 1,
        rounds,
        s.clean_solve_rate,
        s.clean_accuracy,
        s.examples_distilled,
        s.examples_from_hints,
        hinted,
    )
    if not config.log_excerpts:
        return
    hints = {h.scenario_id: h.hint for h in buffer.hints if h.hint}
    shown = 0
    for example in buffer.examples:
        if example.source == "hinted" and shown < config.log_excerpts:
            log.info(
                "  hint for %s: %r -> relabelled: user %r | assistant %r",
                example.scenario_id,
                text.excerpt(hints.get(example.scenario_id, "")),
                text.excerpt(example.messages[-1]["content"]),
                text.excerpt(example.completion),
            )
            shown += 1
    for record in buffer.hints:
        if record.dropped and shown < config.log_excerpts:
            log.info(
                "  no hint for %s (%s): %r",
                record.scenario_id,
                record.dropped,
                text.excerpt(record.attempts[-1].text or record.attempts[-1].detail)
                if record.attempts
                else "",
            )
            shown += 1
    clean = next((e for e in buffer.examples if e.source == "clean"), None)
    if clean is not None:
        log.info(
            "  kept %s: user %r | assistant %r",
            clean.scenario_id,
            text.excerpt(clean.messages[-1]["content"]),
            text.excerpt(clean.completion),
        )


def round_totals(totals: Mapping[str, float], buffer: RoundBuffer) -> dict[str, float]:
    """`totals` plus a round's counts (the names of `ei_round` events and the summary)."""
    stats = buffer.stats.model_dump()
    return {**totals, **{key: totals.get(key, 0) + stats[key] for key in _TOTALS}}


def teacher_of(
    ctx: RunContext, config: EIConfig, snapshot: Mapping[str, JsonValue] | None
) -> tuple[LLMClient | None, str | None]:
    """The teacher client (and its name) with its counters restored from a saved state, or
    (None, None) without teacher hints."""
    if not config.enable_teacher_hints:
        return None, None
    return make_teacher(ctx.model, config, LLMCounters.restore(dict(snapshot or {})))


async def ei_round(
    ctx: RunContext,
    config: EIConfig,
    index: int,
    *,
    system_prompt: str | None,
    teacher: LLMClient | None,
    pending: RoundBuffer | None,
    pending_step: int | None,
    keep: Callable[[RoundBuffer, int], None],
    rounds: int,
    tag: str = "",
) -> tuple[RoundBuffer, dict[str, float] | None, float | None]:
    """One expert-iteration round, the same in `mode=ei` and in a schedule's EI phase: collect,
    `keep` the buffer (with the step before training: the caller writes it into its state)
    before any weight changes, distil, and return (buffer, training metrics, seconds).

    `pending` is a kept buffer found on resume: trained on again, unless the model is already
    past `pending_step` (the kill came after training, before the bookkeeping)."""
    if pending is not None:
        if await ctx.model.get_step() > (pending_step or 0):
            log.info("resuming: EI round %d had trained before the kill", pending.round + 1)
            return pending, {"recovered_after_kill": 1.0}, None
        log.info("resuming: training EI round %d on its saved buffer", pending.round + 1)
        return pending, await distill_in_run(ctx, pending, config), None
    began = time.monotonic()
    output = await collect_round(
        ctx.model,
        one_scenario(ctx, "expert iteration"),
        config,
        index,
        system_prompt=system_prompt,
        teacher=teacher,
        backend=ctx.backend,
        max_exceptions=ctx.config.max_exceptions,
    )
    write_round_records(ctx.files, output, tag=tag)
    keep(output.buffer, await ctx.model.get_step())  # the buffer is on disk before training
    log_round(output.buffer, config, rounds)
    metrics = await distill_in_run(ctx, output.buffer, config)
    return output.buffer, metrics, time.monotonic() - began


def round_event(
    ctx: RunContext,
    buffer: RoundBuffer,
    step: int,
    train_metrics: dict[str, float] | None,
    seconds: float | None,
) -> EIRoundEvent:
    """A trained round's `ei_round` event (its files are written before it trains, by
    `ei.files.write_round_records`)."""
    stats = buffer.stats.model_dump()
    return EIRoundEvent.model_validate(  # the round's stats and `train/*` metrics: open-ended
        {
            "round": buffer.round,
            "step": step,
            **{k: v for k, v in stats.items() if k != "round"},
            **{f"train/{k}": v for k, v in (train_metrics or {}).items()},
            "trained": train_metrics is not None,
            "seconds": seconds or 0.0,
            **clocks(ctx),
        }
    )


async def distill_in_run(
    ctx: RunContext, buffer: RoundBuffer, config: EIConfig
) -> dict[str, float] | None:
    """Train on a round's buffer with the run's optimiser settings (for `distill=rl`)."""
    run = ctx.config
    return await distill_round(
        ctx.model,
        ctx.backend,
        buffer,
        config,
        learning_rate=run.rl.learning_rate,
        loss_fn=run.rl.loss_fn,
        kl_penalty_coef=run.rl.kl_penalty_coef,
        scale_rewards=run.rl.scale_rewards,
    )


class EIPhase:
    """The ei phase: `entry.count` expert-iteration rounds under the run's `s`, each staged (its
    buffer in the state before it trains) and booked through the phase's ledger. Alone
    (`mode=ei`) it evaluates on val every `eval_every_rounds` rounds, by round."""

    kind: ClassVar[PhaseKind] = "ei"
    journaled: ClassVar[bool] = False
    state_model = EIState
    what = "an expert-iteration"

    def __init__(self, config: EIConfig) -> None:
        self.config = config  # the run's `ei` settings, `rounds` the phase's count

    async def fresh(self, run: PhaseRun[EIState]) -> EIState:
        ctx = run.ctx
        if run.alone and (step := await ctx.model.get_step()):
            raise ValueError(
                f"{ctx.files.root} holds a model at step {step} but no EI state; use a new run_dir"
            )
        return EIState(fingerprint=self.fingerprint(ctx))

    def fingerprint(self, ctx: RunContext) -> str:
        return fingerprint(self.config, ctx.scenario.name, ctx.config.system_prompt)

    def part(self, state: RunState) -> EIState | None:
        return state.ei

    def settled(self, state: EIState) -> EIState:
        return state.model_copy(update={"rounds_done": 0, "pending": None, "pending_step": None})

    def measured(self, state: EIState) -> float | None:
        return None

    async def run(self, run: PhaseRun[EIState], state: EIState) -> EIState:
        ctx, config = run.ctx, self.config
        check_records(ctx, config)
        (ctx.files.root / "ei").mkdir(exist_ok=True)
        fp = self.fingerprint(ctx)
        if not state.fingerprint:  # a list's state from an older art_rlvr kept none
            state = state.model_copy(update={"fingerprint": fp})
        if state.fingerprint != fp:
            raise ValueError(
                f"{ctx.files.root} holds an EI run with other settings (seed, sizes, sampling, "
                "teacher or distillation differ); use a new run_dir, or the same settings to "
                "resume"
            )
        teacher, _ = teacher_of(ctx, config, state.teacher_counters)
        rounds = run.entry.count
        if run.alone and state.pending is None and state.rounds_done:
            log.info("resuming at round %d of %d", state.rounds_done + 1, rounds)
        while True:
            done = state.rounds_done
            if state.pending is None:  # a kept buffer's round was evaluated before it was kept
                if run.alone and eval_due(done, rounds, config.eval_every_rounds):
                    state = await self.evaluate(run, state, done)
                if done >= rounds:
                    return state
            keep = stager(run, state)

            buffer, train_metrics, seconds = await ei_round(
                ctx,
                config,
                run.entry.round + done,
                system_prompt=run.prompt,
                teacher=teacher,
                pending=state.pending,
                pending_step=state.pending_step,
                keep=keep,
                rounds=run.ei_rounds,
                tag="" if run.alone else "_ei",
            )
            step = await ctx.model.get_step()
            state = finish_round(state, buffer, train_metrics, teacher)
            state = run.ledger.book(state, round_event(ctx, buffer, step, train_metrics, seconds))

    async def evaluate(self, run: PhaseRun[EIState], state: EIState, done: int) -> EIState:
        """Alone: the greedy val evaluation after `done` rounds (once: recorded by round)."""
        if str(done) in state.evals:
            return state
        ctx = run.ctx
        report = await run_eval(ctx, await ctx.model.get_step(), round=done)
        state = state.model_copy(
            update={
                "evals": {**state.evals, str(done): report.accuracy},
                "eval_steps": {**state.eval_steps, str(done): await ctx.model.get_step()},
            }
        )
        run.ledger.save(state)
        return state

    async def summary(self, run: PhaseRun[EIState], state: EIState) -> Summary:
        ctx, config, rounds = run.ctx, self.config, run.entry.count
        evals, totals = state.evals, state.totals
        attempts = totals.get("clean_attempts", 0.0)
        teacher, teacher_name = teacher_of(ctx, config, state.teacher_counters)
        summary: Summary = {
            "val_accuracy_before": evals.get("0"),
            "val_accuracy_after": evals.get(str(rounds)),
            "val_curve": {int(k): v for k, v in sorted(evals.items(), key=lambda kv: int(kv[0]))},
            "rounds": state.rounds_done,
            "steps": await ctx.model.get_step(),
            "distill": config.distill,
            "rollouts": int(attempts + totals.get("hinted_attempts", 0.0)),
            **totals_of(totals),
            "teacher": teacher_name,
            "hint_reliance_mean": (
                totals["hint_reliance_sum"] / totals["hint_reliance_n"]
                if totals.get("hint_reliance_n")
                else None
            ),
        }
        if teacher is not None:
            snapshot = teacher.counters.snapshot()
            summary |= {
                "teacher_calls": snapshot["calls"],
                "teacher_call_errors": snapshot["error_total"],
            }
        if ctx.config.eval_test and ctx.scenario.splits["test"]:
            step = await ctx.model.get_step()
            report = await run_eval(ctx, step, split="test", round=state.rounds_done)
            summary["test_accuracy_after"] = report.accuracy
        return summary


def stager(run: PhaseRun[EIState], state: EIState) -> Callable[[RoundBuffer, int], None]:
    """Stages a collected round's buffer (and the step it trains from) before it trains."""

    def keep(buffer: RoundBuffer, step: int) -> None:
        run.ledger.stage(state.model_copy(update={"pending": buffer, "pending_step": step}))

    return keep


def totals_of(totals: Mapping[str, float]) -> dict[str, int]:
    """The round counts of `totals` under their names (`ei_round` events, the summary)."""
    return {k: int(v) for k, v in totals.items() if k in _TOTALS}


def finish_round(
    state: EIState,
    buffer: RoundBuffer,
    train_metrics: dict[str, float] | None,
    teacher: LLMClient | None,
) -> EIState:
    """The state after a round: its counts added, its buffer no longer pending."""
    totals = round_totals(state.totals, buffer)
    totals["rounds_trained"] = totals.get("rounds_trained", 0.0) + float(train_metrics is not None)
    reliance = [e.hint_reliance for e in buffer.examples if e.hint_reliance is not None]
    totals["hint_reliance_sum"] = totals.get("hint_reliance_sum", 0.0) + sum(reliance)
    totals["hint_reliance_n"] = totals.get("hint_reliance_n", 0.0) + len(reliance)
    return state.model_copy(
        update={
            "rounds_done": state.rounds_done + 1,
            "pending": None,
            "pending_step": None,
            "totals": totals,
            "teacher_counters": teacher.counters.snapshot() if teacher else state.teacher_counters,
        }
    )
