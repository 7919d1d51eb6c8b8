"""One runner for every run: its list of phases (`RunConfig.plan`), of any length, whatever
the mode (each mode is a preset of the list: `mode=rl` is `rl:<n_batches>`, `mode=gepa_rl`
is `gepa,rl:8,gepa,rl:8,...`).

Each entry runs its kind's one driver (`loops.phase.Phase`: `RLPhase`, `GEPAPhase`, `EIPhase`,
`EvalPhase`) on that kind's own state. What a list of one does differently is said once, in
`PhaseRun.alone`: its phase evaluates itself as it goes and its summary is the run's, and its
state file is its phase's state (`loops.state`); a longer list keeps a `RunState` (its place,
the prompt `s`, the curve, a section per kind), evaluates on val after every phase (the curve),
and sums itself up here.

After an RL phase the weights have changed, so the next GEPA phase starts from the current
prompt *and the frontier it kept*, and re-scores all of them (within its budget) before
proposing. Every change of `s` is logged with old and new excerpts and the Pareto scores that
justified it (`prompt_changes` in state.json and summary.json, `event: prompt_change` lines).

Resume (`loops.phase`): work that changes the model is staged, committed and booked through
the phase's `Ledger`, which writes the run's state atomically; paid evaluations (a GEPA
search's in `gepa/round_<r>/journal.jsonl`, an eval phase's in `evals/`) go into the one
write-ahead journal (`rundir.journal`) as each is paid for. A killed run re-run with the same
command continues where it stopped: no step lost or repeated, no evaluation paid twice, the same
prompt and frontier. A resume with another list is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pydantic import BaseModel

from art_rlvr.core.text import excerpt
from art_rlvr.ei.config import EIConfig
from art_rlvr.gepa.start import choose_seed_prompt
from art_rlvr.loops.context import RunContext, one_scenario, run_eval
from art_rlvr.loops.ei import EIPhase, totals_of
from art_rlvr.loops.evaluate import EvalPhase
from art_rlvr.loops.gepa import GEPAPhase
from art_rlvr.loops.phase import Ledger, Phase, PhaseRun, Summary
from art_rlvr.loops.plan import PlanEntry, spell
from art_rlvr.loops.rl import STATE, RLPhase, spend
from art_rlvr.loops.state import (
    CurvePoint,
    RunState,
    ScheduleState,
    from_schedule,
    is_current,
)
from art_rlvr.rundir.files import StateFileError

log = logging.getLogger(__name__)


async def run_phases(
    ctx: RunContext, plan: Sequence[PlanEntry] | None = None, *, ei: EIConfig | None = None
) -> Summary:
    """Run (or resume) the run's phases (`plan`: the config's); the dict goes into
    summary.json. `ei` replaces the run's EI settings (a caller that holds its own)."""
    return await Runner(ctx, tuple(plan or ctx.config.plan), ei or ctx.config.ei).run()


async def run_ei(ctx: RunContext, config: EIConfig) -> Summary:
    """Expert iteration alone with these settings: the list `ei:<rounds>`."""
    return await run_phases(ctx, (PlanEntry(kind="ei", count=config.rounds),), ei=config)


def initial_prompt(ctx: RunContext) -> str:
    """The `s` a list of phases starts from: GEPA's seed prompt, the run's, the scenario's."""
    cfg = ctx.config
    gepa = cfg.gepa.seed_prompt if cfg.with_gepa else None
    return choose_seed_prompt(
        gepa=gepa,
        run=cfg.system_prompt,
        scenario_default=one_scenario(ctx, "GEPA").default_system_prompt,
    )


def resumed_state(ctx: RunContext, phases: Sequence[PlanEntry]) -> RunState:
    """A list's state from the run folder (a new one if none; an older art_rlvr's layout
    converted): a state written for another list of phases is refused, not continued at the
    wrong place."""
    spelt = spell(phases)
    raw = ctx.files.read_json(STATE)
    if raw is None:
        return RunState(plan=spelt, start_prompt=initial_prompt(ctx))
    if is_current(raw):
        state = ctx.files.read_state(STATE, RunState, "a schedule's")
    else:
        old = ctx.files.read_state(STATE, ScheduleState, "a schedule's")
        assert old is not None
        running = phases[old.phase] if old.phase < len(phases) else None
        count = running.count if running is not None and running.kind == "rl" else None
        state = from_schedule(old, running_rl=count)
    assert state is not None
    if state.plan is not None and state.plan != spelt:
        raise StateFileError(
            f"{ctx.files.root} holds a run of phases={state.plan}, not phases={spelt}; "
            "resume it with the same phases (or mode and its keys), or use a new run_dir"
        )
    return state.model_copy(update={"plan": spelt})


class Runner:
    """A list of phases run in order, each on its own state, resumed where it stopped."""

    def __init__(self, ctx: RunContext, plan: tuple[PlanEntry, ...], ei: EIConfig) -> None:
        self.ctx, self.plan, self.ei = ctx, plan, ei
        self.alone = len(plan) == 1
        self.ei_rounds = sum(p.count for p in plan if p.kind == "ei")
        self.state = RunState(start_prompt=ctx.config.system_prompt)  # a list of one's place

    async def run(self) -> Summary:
        ctx, plan = self.ctx, self.plan
        if not self.alone:
            self.state = resumed_state(ctx, plan)
            if self.state.phase >= len(plan):
                log.info("all %d phases of the schedule are done; finishing the summary", len(plan))
            elif self.state.phase:
                log.info("resuming the schedule at phase %d of %d", self.state.phase + 1, len(plan))
            log.info("schedule: %s (phases=%s)", " -> ".join(p.label for p in plan), spell(plan))
            await self.record("start")
        summary: Summary = {}
        for index, entry in enumerate(plan):
            if index < self.state.phase:  # done; its evaluation too, unless a kill came between
                await self.record(entry.label)
                continue
            if not self.alone:
                log.info(
                    "phase %d/%d: %s (s: %s)",
                    index + 1,
                    len(plan),
                    entry.label,
                    excerpt(self.state.prompt or "", 80),
                )
            summary = await self.dispatch(index, entry)
            await self.record(entry.label)
        return summary if self.alone else await self.summary()

    async def dispatch(self, index: int, entry: PlanEntry) -> Summary:
        match entry.kind:
            case "rl":
                return await self.through(RLPhase(), index, entry)
            case "gepa":
                return await self.through(GEPAPhase(), index, entry)
            case "ei":
                config = self.ei.model_copy(update={"rounds": entry.count})
                return await self.through(EIPhase(config), index, entry)
            case "eval":
                return await self.through(EvalPhase(), index, entry)

    async def through[S: BaseModel](self, phase: Phase[S], index: int, entry: PlanEntry) -> Summary:
        """One phase on its own state, from where a kill left it; alone, its summary."""
        ctx = self.ctx
        if self.alone:
            start = 0
        elif self.state.start_step is None:  # the step it began at, kept before it works
            start = await ctx.model.get_step()
            self.write(self.state.model_copy(update={"start_step": start}))
        else:
            start = self.state.start_step
        run: PhaseRun[S] = PhaseRun(
            ctx=ctx,
            entry=entry,
            index=index,
            alone=self.alone,
            prompt=self.state.prompt,
            start_step=start,
            ei_rounds=self.ei_rounds,
            ledger=Ledger(ctx, lambda section: self.keep(phase, section)),
        )
        state = self.read(phase) if self.alone else phase.part(self.state)
        state = await phase.run(run, state if state is not None else await phase.fresh(run))
        if self.alone:
            return await phase.summary(run, state)
        done = self.state.model_copy(
            update={"phase": index + 1, "start_step": None, **self.section(phase, state)}
        )
        measured = phase.measured(state)
        if measured is not None:  # booked as the phase's point, so no greedy evaluation repeats it
            point = CurvePoint(after=entry.label, step=await ctx.model.get_step(), val=measured)
            done = done.model_copy(
                update={
                    "evals": {**done.evals, entry.label: measured},
                    "curve": [*done.curve, point],
                }
            )
        self.write(done.model_copy(update=self.section(phase, phase.settled(state))))
        return {}

    def read[S: BaseModel](self, phase: Phase[S]) -> S | None:
        """A list of one: its phase's state file, or None (none yet, or a journaled phase)."""
        if phase.journaled:
            return None
        return self.ctx.files.read_state(STATE, phase.state_model, phase.what)

    def keep[S: BaseModel](self, phase: Phase[S], section: S) -> None:
        """A phase's `Ledger.save`: its state into the run's state file."""
        if self.alone:
            if not phase.journaled:
                self.ctx.files.write_state(STATE, section)
            return
        self.write(self.state.model_copy(update=self.section(phase, section)))

    def section[S: BaseModel](self, phase: Phase[S], section: S) -> dict[str, S]:
        return {phase.kind: section} if phase.kind in RunState.model_fields else {}

    def write(self, state: RunState) -> None:
        self.state = state
        self.ctx.files.write_state(STATE, state)

    async def record(self, label: str) -> None:
        """A list's greedy val evaluation after a phase (or at the "start"), once."""
        if self.alone or label in self.state.evals:
            return
        ctx, state = self.ctx, self.state
        step = await ctx.model.get_step()
        report = await run_eval(ctx, step, system_prompt=state.prompt, tag=f"_{label}")
        point = CurvePoint(after=label, step=step, val=report.accuracy)
        self.write(
            state.model_copy(
                update={
                    "evals": {**state.evals, label: report.accuracy},
                    "curve": [*state.curve, point],
                }
            )
        )

    async def summary(self) -> Summary:
        """A list's summary: the curve, the prompt it ended with, what each kind counted."""
        ctx, state = self.ctx, self.state
        step = await ctx.model.get_step()
        summary: Summary = {
            "val_accuracy_before": state.evals.get("start"),
            "val_accuracy_after": state.curve[-1].val if state.curve else None,
            "steps": step,
            **spend(state.rl),
            "phases": [p.label for p in self.plan],
            "curve": [p.model_dump() for p in state.curve],
            "final_prompt": state.prompt,
            "prompt_changes": len(state.gepa.prompt_changes),
            "metric_calls_used": state.gepa.metric_calls,
            "reflection_calls": state.gepa.reflection_calls,
            "reflection_errors": state.gepa.reflection_errors,
        }
        if ctx.config.with_expert_iteration:
            # mode=ei's totals under its names (`teacher_errors`: scenarios whose teacher call
            # failed after retries), so the end-of-run summary and the report read them
            ei = state.ei
            summary |= totals_of(ei.totals) if ei is not None else {}
            counters = (ei.teacher_counters if ei is not None else None) or {}
            summary["teacher_calls"] = counters.get("calls", 0)
        if ctx.config.eval_test and ctx.scenario.splits["test"]:
            report = await run_eval(ctx, step, split="test", system_prompt=state.prompt)
            summary["test_accuracy_after"] = report.accuracy
        return summary
