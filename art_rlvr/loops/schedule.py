"""A list of phases run in order: block coordinate ascent over the prompt `s` and the weights.

Any run of more than one phase runs here (`loops.runner`): `phases=gepa,rl:8,ei,rl:8`, or a
mode's preset. `mode=gepa_rl`: for each of `rounds` rounds, a GEPA phase optimises `s` with the
current weights, then an RL phase trains `rl_batches_per_round` batches with `s` held fixed.
`skip_first_gepa` starts with RL. `gepa_rl_ei` (or `enable_expert_iteration=true` with
`gepa_rl`) adds an expert-iteration round after each RL phase; `enable_expert_iteration=true`
with `mode=rl` is the same list without GEPA (`RunConfig.plan`). An eval phase is the sampled
evaluation of `mode=eval` under the current `s`; every phase is followed by a greedy val
evaluation (the curve).

After an RL phase the weights have changed, so the next GEPA phase starts from the current
prompt *and the frontier it kept*, and re-scores all of them (within its budget) before
proposing. Every change of `s` is logged with old and new excerpts and the Pareto scores that
justified it (`prompt_changes` in state.json and summary.json, `event: prompt_change` lines).

Resume: `state.json` (`ScheduleState`) holds the phase index (and the rounds done within a
multi-round EI phase), the current prompt, the kept frontier, the target step of a running RL
phase, a saved EI buffer, the evaluation record and the list's spelling (a resume with another
list is refused); it is written atomically after each unit of work. GEPA phases journal
themselves (`gepa/round_<r>/`), RL steps are checkpoints whose batch is a function of (seed,
step), an eval phase journals in `evals/`, so a killed run re-run with the same command
continues where it stopped: no step lost or repeated, the same prompt and frontier.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from art_rlvr.core.text import excerpt
from art_rlvr.ei.data import RoundBuffer
from art_rlvr.gepa.start import choose_seed_prompt
from art_rlvr.loops.context import RunContext, one_scenario, run_eval
from art_rlvr.loops.plan import Phase, spell
from art_rlvr.loops.rl import STATE, StateModel, TrainState, spend, train_until
from art_rlvr.rundir.events import PromptChangeEvent
from art_rlvr.rundir.files import StateFileError

log = logging.getLogger(__name__)


class CurvePoint(StateModel):
    """The schedule's val accuracy after a phase (`after` is its label, or "start")."""

    after: str
    step: int
    val: float


class ScheduleState(TrainState):
    """The schedule's state.json: the phase index, the current prompt and kept frontier, the
    target step of a running phase, a saved EI buffer and what every phase counted."""

    phase: int
    prompt: str
    plan: str | None = None  # the list's `phases=` spelling (None: a run from before it)
    phase_done: int = 0  # rounds done within the current (multi-round EI) phase
    curve: list[CurvePoint] = Field(default_factory=list)
    frontier: list[str] = Field(default_factory=list)
    prompt_changes: list[PromptChangeEvent] = Field(default_factory=list)
    phase_target: int | None = None
    ei_buffer: RoundBuffer | None = None
    ei_totals: dict[str, int] = Field(default_factory=dict)
    teacher_counters: dict[str, Any] | None = None  # llm.LLMCounters.snapshot()
    gepa_metric_calls: int = 0
    reflection_calls: int = 0
    reflection_errors: int = 0


def initial_prompt(ctx: RunContext) -> str:
    cfg = ctx.config
    gepa = cfg.gepa.seed_prompt if cfg.with_gepa else None
    return choose_seed_prompt(
        gepa=gepa,
        run=cfg.system_prompt,
        scenario_default=one_scenario(ctx, "GEPA").default_system_prompt,
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
        one_scenario(ctx, "GEPA"),
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
    """The phase's RL steps with `s` held fixed (the target step is saved first, so a resumed
    phase trains exactly the steps it has left)."""
    target = state.phase_target
    if target is None:
        target = await ctx.model.get_step() + phase.count
        state = state.model_copy(update={"phase_target": target})
        ctx.files.write_state(STATE, state)
    return await train_until(
        ctx,
        state,
        until=target,
        system_prompt=state.prompt,
        eval_at=lambda _step: False,
    )


async def ei_phase(
    ctx: RunContext, state: ScheduleState, phase: Phase, total_rounds: int
) -> ScheduleState:
    """The phase's expert-iteration rounds under the current `s`: `mode=ei`'s round
    (`loops.ei.ei_round`) each, its buffer kept in the schedule's state, the rounds done
    within the phase too (a resumed phase runs the rounds it has left)."""
    for offset in range(state.phase_done, phase.count):
        state = await ei_phase_round(ctx, state, phase.round + offset, total_rounds)
        state = state.model_copy(
            update={"phase_done": offset + 1, "phase_target": None, "ei_buffer": None}
        )
        ctx.files.write_state(STATE, state)
    return state


async def ei_phase_round(
    ctx: RunContext, state: ScheduleState, round: int, total_rounds: int
) -> ScheduleState:
    from art_rlvr.loops.ei import book_round, ei_round, round_totals, teacher_of

    ei = ctx.config.ei
    teacher, _ = teacher_of(ctx, ei, state.teacher_counters)

    def keep(buffer: RoundBuffer, step: int) -> None:
        kept = {"ei_buffer": buffer, "phase_target": step}
        ctx.files.write_state(STATE, state.model_copy(update=kept))

    buffer, metrics, seconds = await ei_round(
        ctx,
        ei,
        round,
        system_prompt=state.prompt,
        teacher=teacher,
        pending=state.ei_buffer,
        pending_step=state.phase_target,
        keep=keep,
        rounds=total_rounds,
        tag="_ei",
    )
    book_round(ctx, buffer, step=await ctx.model.get_step(), train_metrics=metrics, seconds=seconds)
    totals = {k: int(v) for k, v in round_totals(state.ei_totals, buffer).items()}
    counters = teacher.counters.snapshot() if teacher is not None else state.teacher_counters
    return state.model_copy(update={"ei_totals": totals, "teacher_counters": counters})


async def eval_phase(ctx: RunContext, state: ScheduleState, phase: Phase) -> ScheduleState:
    """`mode=eval`'s sampled evaluation (eval_samples, pass@k) under the current `s`, booked
    as the phase's point on the curve (so no greedy evaluation repeats it)."""
    from art_rlvr.loops.evaluate import sampled_eval

    result = await sampled_eval(
        ctx.config,
        ctx.scenario,
        ctx.files,
        ctx.model,
        ctx.started,
        ctx.cpu_started,
        system_prompt=state.prompt,
    )
    accuracy = result["val_accuracy_after"]
    point = CurvePoint(after=phase.label, step=result["steps"], val=accuracy)
    return state.model_copy(
        update={"evals": {**state.evals, phase.label: accuracy}, "curve": [*state.curve, point]}
    )


def resumed_state(ctx: RunContext, phases: Sequence[Phase]) -> ScheduleState:
    """The schedule's state from the run folder (a new one if none): a state written for
    another list of phases is refused, not continued at the wrong place."""
    spelt = spell(phases)
    state = ctx.files.read_state(STATE, ScheduleState, "a schedule's")
    if state is None:
        return ScheduleState(phase=0, prompt=initial_prompt(ctx), plan=spelt)
    if state.plan is not None and state.plan != spelt:
        raise StateFileError(
            f"{ctx.files.root} holds a run of phases={state.plan}, not phases={spelt}; "
            "resume it with the same phases (or mode and its keys), or use a new run_dir"
        )
    return state.model_copy(update={"plan": spelt})


async def run_schedule(ctx: RunContext, phases: Sequence[Phase]) -> dict[str, Any]:
    """Run (or resume) a list of phases; the result goes into summary.json."""
    cfg = ctx.config
    state = resumed_state(ctx, phases)
    total_ei = sum(p.count for p in phases if p.kind == "ei")
    if state.phase >= len(phases):
        log.info("all %d phases of the schedule are done; finishing the summary", len(phases))
    elif state.phase:
        log.info("resuming the schedule at phase %d of %d", state.phase + 1, len(phases))
    log.info("schedule: %s (phases=%s)", " -> ".join(p.label for p in phases), spell(phases))

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
        elif phase.kind == "ei":
            state = await ei_phase(ctx, state, phase, total_ei)
        else:
            state = await eval_phase(ctx, state, phase)
        state = state.model_copy(
            update={"phase": index + 1, "phase_target": None, "ei_buffer": None, "phase_done": 0}
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
    if cfg.eval_test and ctx.scenario.splits["test"]:
        report = await run_eval(ctx, step, split="test", system_prompt=state.prompt)
        summary["test_accuracy_after"] = report.accuracy
    return summary
