"""Block coordinate ascent over the prompt `s` and the weights: GEPA, RL (and EI) phases in rounds.

`mode=gepa_rl`: for each of `rounds` rounds, a GEPA phase optimises `s` with the current
weights, then an RL phase trains `rl_batches_per_round` batches with `s` held fixed.
`skip_first_gepa` starts with RL. `gepa_rl_ei` (or `enable_expert_iteration=true` with `rl` or
`gepa_rl`) adds an expert-iteration round after each RL phase.

After an RL phase the weights have changed, so the next GEPA phase starts from the current
prompt *and the frontier it kept*, and re-scores all of them (within its budget) before
proposing. Every change of `s` is logged with old and new excerpts and the Pareto scores that
justified it (`prompt_changes` in state.json and summary.json, `event: prompt_change` lines).

Resume: `state.json` holds the phase index, the current prompt, the kept frontier, the target
step of a running RL phase, a saved EI buffer and the evaluation record; it is written atomically
after each unit of work. GEPA phases journal themselves (`gepa/round_<r>/`), RL steps are
checkpoints whose batch is a function of (seed, step), so a killed run re-run with the same
command continues where it stopped: no step lost or repeated, the same prompt and frontier.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from art_rlvr.gepa.start import choose_seed_prompt
from art_rlvr.loops.context import RunContext, one_task, run_eval
from art_rlvr.loops.rl import STATE, spend, train_until
from art_rlvr.records import CurvePoint, PromptChangeEvent, ScheduleState
from art_rlvr.text import excerpt

log = logging.getLogger(__name__)

PhaseKind = Literal["gepa", "rl", "ei"]


class Phase(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: PhaseKind
    round: int

    @property
    def label(self) -> str:
        return f"{self.kind}_r{self.round}"


def plan(rounds: int, *, gepa: bool, skip_first_gepa: bool, expert_iteration: bool) -> list[Phase]:
    """The schedule, fixed by the config: a pure function, so a resumed run sees the same."""
    phases: list[Phase] = []
    for r in range(rounds):
        if gepa and not (r == 0 and skip_first_gepa):
            phases.append(Phase(kind="gepa", round=r))
        phases.append(Phase(kind="rl", round=r))
        if expert_iteration:
            phases.append(Phase(kind="ei", round=r))
    return phases


def initial_prompt(ctx: RunContext) -> str:
    cfg = ctx.config
    gepa = cfg.gepa.seed_prompt if cfg.mode in ("gepa_rl", "gepa_rl_ei") else None
    return choose_seed_prompt(
        gepa=gepa, run=cfg.system_prompt, task_default=one_task(ctx, "GEPA").default_system_prompt
    )


async def gepa_phase(
    ctx: RunContext, state: ScheduleState, phase: Phase, index: int
) -> ScheduleState:
    """Optimise `s` with the weights as they are; adopt the best candidate if it beats `s`."""
    from art_rlvr.gepa.optimizer import run_optimizer
    from art_rlvr.loops.gepa import event_metrics

    cfg = ctx.config
    old = state.prompt
    config = cfg.gepa.model_copy(update={"seed": cfg.gepa.seed * 1000 + phase.round})
    result, _ = await run_optimizer(
        ctx.model,
        one_task(ctx, "GEPA"),
        seed_prompt=old,
        config=config,
        run_dir=ctx.files.root / "gepa" / f"round_{phase.round}",
        on_event=lambda e: ctx.files.append_event(event_metrics(e, ctx, phase.round)),
        carry=state.frontier,
    )
    seed = result.candidates[0]
    best = next(c for c in result.candidates if c.index == result.best_index)
    state = state.model_copy(
        update={
            "gepa_metric_calls": state.gepa_metric_calls + result.metric_calls_used,
            "reflection_calls": state.reflection_calls + result.reflection.get("calls", 0),
            "reflection_errors": state.reflection_errors + result.reflection.get("error_total", 0),
            "frontier": [c.prompt for c in result.frontier if c.prompt != best.prompt][
                : cfg.gepa.pool_size - 1
            ],
        }
    )
    if best.prompt != old:
        change = PromptChangeEvent(
            round=phase.round,
            phase=index,
            step=await ctx.model.get_step(),
            old=old,
            new=best.prompt,
            old_pareto_mean=seed.mean,
            new_pareto_mean=best.mean,
            origin=best.origin,
            old_val_accuracy=result.seed_val_accuracy,
            new_val_accuracy=result.best_val_accuracy,
        )
        state = state.model_copy(
            update={"prompt_changes": [*state.prompt_changes, change], "prompt": best.prompt}
        )
        ctx.files.append_event(change)
        log.info(
            "round %d: s changed (Pareto mean %.3f -> %.3f)\n  old: %s\n  new: %s",
            phase.round,
            seed.mean,
            best.mean,
            excerpt(old, 120),
            excerpt(best.prompt, 120),
        )
    else:
        log.info("round %d: GEPA kept s (Pareto mean %.3f)", phase.round, seed.mean)
    return state


async def rl_phase(ctx: RunContext, state: ScheduleState, phase: Phase) -> ScheduleState:
    """`rl_batches_per_round` RL steps with `s` held fixed (the target step is saved first, so
    a resumed phase trains exactly the steps it has left)."""
    target = state.phase_target
    if target is None:
        target = await ctx.model.get_step() + ctx.config.rl_batches_per_round
        state = state.model_copy(update={"phase_target": target})
        ctx.files.write_state(STATE, state)
    return await train_until(
        ctx,
        state,
        until=target,
        system_prompt=state.prompt,
        eval_at=lambda _step: False,
    )


async def ei_phase(ctx: RunContext, state: ScheduleState, phase: Phase) -> ScheduleState:
    """One expert-iteration round under the current `s`: `mode=ei`'s round (`loops.ei.ei_round`),
    its buffer kept in the schedule's state."""
    from art_rlvr.ei.records import RoundBuffer
    from art_rlvr.loops.ei import book_round, ei_round, round_totals, teacher_of

    ei = ctx.config.ei
    teacher, _ = teacher_of(ctx, ei, state.teacher_counters)

    def keep(buffer: RoundBuffer, step: int) -> None:
        kept = {"ei_buffer": buffer.model_dump(mode="json"), "phase_target": step}
        ctx.files.write_state(STATE, state.model_copy(update=kept))

    pending = state.ei_buffer
    buffer, metrics, seconds = await ei_round(
        ctx,
        ei,
        phase.round,
        system_prompt=state.prompt,
        teacher=teacher,
        pending=RoundBuffer.model_validate(pending) if pending is not None else None,
        pending_step=state.phase_target,
        keep=keep,
        rounds=ctx.config.rounds,
        tag="_ei",
    )
    book_round(ctx, buffer, step=await ctx.model.get_step(), train_metrics=metrics, seconds=seconds)
    totals = {k: int(v) for k, v in round_totals(state.ei_totals, buffer).items()}
    counters = teacher.counters.snapshot() if teacher is not None else state.teacher_counters
    return state.model_copy(update={"ei_totals": totals, "teacher_counters": counters})


async def run_schedule(ctx: RunContext) -> dict[str, Any]:
    """Run (or resume) the GEPA / RL / EI schedule; the result goes into summary.json."""
    cfg = ctx.config
    phases = plan(
        cfg.rounds,
        gepa=cfg.mode in ("gepa_rl", "gepa_rl_ei"),
        skip_first_gepa=cfg.skip_first_gepa,
        expert_iteration=cfg.with_expert_iteration,
    )
    state = ctx.files.read_state(STATE, ScheduleState, "a schedule's") or ScheduleState(
        phase=0, prompt=initial_prompt(ctx)
    )
    if state.phase >= len(phases):
        log.info("all %d phases of the schedule are done; finishing the summary", len(phases))
    elif state.phase:
        log.info("resuming the schedule at phase %d of %d", state.phase + 1, len(phases))
    log.info("schedule: %s", " -> ".join(p.label for p in phases))

    async def record(state: ScheduleState, label: str, step: int) -> ScheduleState:
        if label in state.evals:
            return state
        report = await run_eval(ctx, step, system_prompt=state.prompt, tag=f"_{label}")
        point = CurvePoint(after=label, step=step, val=report.accuracy)
        state = state.model_copy(
            update={
                "evals": {**state.evals, label: report.accuracy},
                "curve": [*state.curve, point],
            }
        )
        ctx.files.write_state(STATE, state)
        return state

    state = await record(state, "start", await ctx.model.get_step())
    for index, phase in enumerate(phases):
        if index < state.phase:  # done; its evaluation too, unless a kill came between
            state = await record(state, phase.label, await ctx.model.get_step())
            continue
        log.info(
            "phase %d/%d: %s (s: %s)",
            index + 1,
            len(phases),
            phase.label,
            excerpt(state.prompt, 80),
        )
        if phase.kind == "gepa":
            state = await gepa_phase(ctx, state, phase, index)
        elif phase.kind == "rl":
            state = await rl_phase(ctx, state, phase)
        else:
            state = await ei_phase(ctx, state, phase)
        state = state.model_copy(
            update={"phase": index + 1, "phase_target": None, "ei_buffer": None}
        )
        ctx.files.write_state(STATE, state)
        state = await record(state, phase.label, await ctx.model.get_step())
    step = await ctx.model.get_step()
    summary: dict[str, Any] = {
        "val_accuracy_before": state.evals.get("start"),
        "val_accuracy_after": state.curve[-1].val if state.curve else None,
        "steps": step,
        **spend(state),
        "phases": [p.label for p in phases],
        "curve": [p.model_dump() for p in state.curve],
        "final_prompt": state.prompt,
        "prompt_changes": len(state.prompt_changes),
        "metric_calls_used": state.gepa_metric_calls,
        "reflection_calls": state.reflection_calls,
        "reflection_errors": state.reflection_errors,
    }
    if cfg.with_expert_iteration:
        # mode=ei's totals under its names (`teacher_errors`: scenarios whose teacher call
        # failed after retries), so the end-of-run summary and the report read them
        summary |= state.ei_totals
        summary["teacher_calls"] = (state.teacher_counters or {}).get("calls", 0)
    if cfg.eval_test and ctx.task.splits["test"]:
        report = await run_eval(ctx, step, split="test", system_prompt=state.prompt)
        summary["test_accuracy_after"] = report.accuracy
    return summary
