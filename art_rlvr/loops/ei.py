"""The expert-iteration loop of a run: rounds of sample -> select / hint -> relabel -> distil,
with greedy val evaluations in between.

Same shape as `run_rl`: the run folder holds the state (`state.json`, an `EIState`), every
event goes to `metrics.jsonl`, trajectories to `trajectories/` (`train_RRRR` clean attempts,
`hinted_RRRR` hinted ones, `val_RRRR` evaluations, where RRRR is the round), and each round's
buffer (examples, hints, stats) to `ei/round_RRRR.json`, hints also to `ei/hints.jsonl`.

Resume: a round's buffer is written into the state atomically before it trains. A run killed
while sampling redoes that round (its rollouts are seeded); one killed while training trains
on the saved buffer, or, if the checkpoint of that training is already on disk, only finishes
the bookkeeping. Raising `rounds` and re-running continues a finished run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from art_rlvr.core import text
from art_rlvr.ei.config import EIConfig, start_problem
from art_rlvr.ei.data import EIState, RoundBuffer
from art_rlvr.ei.expert import collect_round, distill_round
from art_rlvr.ei.files import write_round_records
from art_rlvr.ei.hints import make_teacher
from art_rlvr.llm.client import LLMClient, LLMCounters
from art_rlvr.loops.context import RunContext, clocks, eval_due, one_scenario, run_eval
from art_rlvr.rundir.events import EIRoundEvent
from art_rlvr.rundir.files import StateFileError

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


def load_state(ctx: RunContext, fp: str, step: int) -> EIState:
    raw = ctx.files.read_json("state.json")
    if raw is None:
        if step:
            raise ValueError(
                f"{ctx.files.root} holds a model at step {step} but no EI state; use a new run_dir"
            )
        return EIState(fingerprint=fp)
    try:
        state = EIState.model_validate(raw)
    except ValidationError:
        raise StateFileError(
            f"{ctx.files.root / 'state.json'} is not an expert-iteration state (another mode's "
            "run?); use a new run_dir"
        ) from None
    if state.fingerprint != fp:
        raise ValueError(
            f"{ctx.files.root} holds an EI run with other settings (seed, sizes, sampling, "
            "teacher or distillation differ); use a new run_dir, or the same settings to resume"
        )
    return state


def save(ctx: RunContext, state: EIState) -> None:
    ctx.files.write_json("state.json", state.model_dump(mode="json"))


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
    ctx: RunContext, config: EIConfig, snapshot: dict[str, Any] | None
) -> tuple[LLMClient | None, str | None]:
    """The teacher client (and its name) with its counters restored from a saved state, or
    (None, None) without teacher hints."""
    if not config.enable_teacher_hints:
        return None, None
    return make_teacher(ctx.model, config, LLMCounters.restore(snapshot or {}))


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


def pending_keeper(ctx: RunContext, state: EIState) -> Callable[[RoundBuffer, int], None]:
    """Writes a collected round's buffer into `state.json` before it trains."""

    def keep(buffer: RoundBuffer, step: int) -> None:
        save(ctx, state.model_copy(update={"pending": buffer, "pending_step": step}))

    return keep


def finish_round(
    ctx: RunContext,
    state: EIState,
    buffer: RoundBuffer,
    train_metrics: dict[str, float] | None,
    teacher: LLMClient | None,
    *,
    step: int,
    seconds: float | None,
) -> EIState:
    totals = round_totals(state.totals, buffer)
    totals["rounds_trained"] = totals.get("rounds_trained", 0.0) + float(train_metrics is not None)
    reliance = [e.hint_reliance for e in buffer.examples if e.hint_reliance is not None]
    totals["hint_reliance_sum"] = totals.get("hint_reliance_sum", 0.0) + sum(reliance)
    totals["hint_reliance_n"] = totals.get("hint_reliance_n", 0.0) + len(reliance)
    state = state.model_copy(
        update={
            "rounds_done": buffer.round + 1,
            "pending": None,
            "pending_step": None,
            "totals": totals,
            "teacher_counters": teacher.counters.snapshot() if teacher else state.teacher_counters,
        }
    )
    save(ctx, state)  # state first: a kill right here loses a log line, repeats nothing
    book_round(ctx, buffer, step=step, train_metrics=train_metrics, seconds=seconds)
    return state


def book_round(
    ctx: RunContext,
    buffer: RoundBuffer,
    *,
    step: int,
    train_metrics: dict[str, float] | None,
    seconds: float | None,
) -> None:
    """A trained round's `ei_round` event (its files are written before it trains, by
    `ei.files.write_round_records`)."""
    stats = buffer.stats.model_dump()
    ctx.files.append_event(
        EIRoundEvent.model_validate(  # the round's stats and `train/*` metrics: open-ended
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
        learning_rate=run.learning_rate,
        loss_fn=run.loss_fn,
        kl_penalty_coef=run.kl_penalty_coef,
        scale_rewards=run.scale_rewards,
    )


async def run_ei(ctx: RunContext, config: EIConfig) -> dict[str, Any]:
    """Run (or resume) expert iteration; the returned dict goes into summary.json."""
    run = ctx.config
    check_records(ctx, config)
    (ctx.files.root / "ei").mkdir(exist_ok=True)
    fp = fingerprint(config, ctx.scenario.name, run.system_prompt)
    step = await ctx.model.get_step()
    state = load_state(ctx, fp, step)
    teacher, teacher_name = teacher_of(ctx, config, state.teacher_counters)
    if state.pending is None and state.rounds_done:
        log.info("resuming at round %d of %d", state.rounds_done + 1, config.rounds)

    while True:
        r = state.rounds_done
        if state.pending is None:  # a kept buffer's round was evaluated before it was collected
            if eval_due(r, config.rounds, config.eval_every_rounds) and str(r) not in state.evals:
                report = await run_eval(ctx, await ctx.model.get_step(), round=r)
                state = state.model_copy(
                    update={
                        "evals": {**state.evals, str(r): report.accuracy},
                        "eval_steps": {**state.eval_steps, str(r): await ctx.model.get_step()},
                    }
                )
                save(ctx, state)
            if r >= config.rounds:
                break
        buffer, train_metrics, seconds = await ei_round(
            ctx,
            config,
            r,
            system_prompt=run.system_prompt,
            teacher=teacher,
            pending=state.pending,
            pending_step=state.pending_step,
            keep=pending_keeper(ctx, state),
            rounds=config.rounds,
        )
        state = finish_round(
            ctx, state, buffer, train_metrics, teacher,
            step=await ctx.model.get_step(), seconds=seconds,
        )  # fmt: skip

    evals = state.evals
    totals = state.totals
    attempts = totals.get("clean_attempts", 0.0)
    summary: dict[str, Any] = {
        "val_accuracy_before": evals.get("0"),
        "val_accuracy_after": evals.get(str(config.rounds)),
        "val_curve": {int(k): v for k, v in sorted(evals.items(), key=lambda kv: int(kv[0]))},
        "rounds": state.rounds_done,
        "steps": await ctx.model.get_step(),
        "distill": config.distill,
        "rollouts": int(attempts + totals.get("hinted_attempts", 0.0)),
        **{k: int(v) for k, v in totals.items() if k in _TOTALS},
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
    if run.eval_test and ctx.scenario.splits["test"]:
        summary["test_accuracy_after"] = (
            await run_eval(ctx, await ctx.model.get_step(), split="test", round=state.rounds_done)
        ).accuracy
    return summary
