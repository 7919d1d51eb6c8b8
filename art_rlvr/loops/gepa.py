"""The gepa phase of a run: evolve the system prompt, log every proposal, report on val.

Its search journals itself in the run folder (`<run>/gepa/`, in a list `gepa/round_<r>/`), so
a killed run re-run in the same folder resumes (see art_rlvr.gepa.optimizer); alone, its
summary is the run's summary.json. Files written: `gepa/prompt_history.jsonl` (every proposal
with its parent, minibatch scores before/after, accepted or why not), `gepa/frontier.json`,
`gepa/result.json`, `metrics.jsonl` events, and the val trajectories of the seed and best
prompts under `trajectories/`.
"""

from __future__ import annotations

import logging
import time
from typing import ClassVar

from art_rlvr.core.text import excerpt
from art_rlvr.gepa.data import HistoryEvent
from art_rlvr.gepa.optimizer import run_optimizer
from art_rlvr.gepa.start import choose_seed_prompt
from art_rlvr.loops.context import RunContext, clocks, one_scenario
from art_rlvr.loops.phase import PhaseRun, Summary
from art_rlvr.loops.plan import PhaseKind
from art_rlvr.loops.state import GEPAState, RunState
from art_rlvr.observe.clock import cpu_seconds
from art_rlvr.rundir.events import GepaEvent, PromptChangeEvent

log = logging.getLogger(__name__)


def event_metrics(event: HistoryEvent, ctx: RunContext, round: int | None = None) -> GepaEvent:
    """A prompt-history event as a metrics.jsonl line (prompt text stays in the history)."""
    return GepaEvent(
        kind=event.kind,
        iteration=event.iteration,
        attempt=event.attempt,
        parents=list(event.parents),
        accepted=event.accepted,
        score_before=event.score_before,
        score_after=event.score_after,
        pareto_mean=event.pareto_mean,
        candidate=event.candidate,
        reason=event.reason,
        metric_calls=event.metric_calls,
        rejection=event.rejection.value if event.rejection is not None else None,
        round=round,
        **clocks(ctx),
    )


class GEPAPhase:
    """The gepa phase: one GEPA search for `s` with the weights as they are. Alone (`mode=gepa`)
    it searches in `gepa/` from the seed prompt and reports the seed and best prompts on val; in
    a list it searches in `gepa/round_<r>/` (seeded by its round) from the current `s` and the
    frontier the last search kept, and adopts the best candidate if it beats `s`."""

    kind: ClassVar[PhaseKind] = "gepa"
    journaled: ClassVar[bool] = True
    state_model = GEPAState
    what = "a GEPA phase's"

    async def fresh(self, run: PhaseRun[GEPAState]) -> GEPAState:
        return GEPAState()

    def part(self, state: RunState) -> GEPAState:
        return state.gepa

    async def run(self, run: PhaseRun[GEPAState], state: GEPAState) -> GEPAState:
        return await (alone(run, state) if run.alone else in_list(run, state))

    def settled(self, state: GEPAState) -> GEPAState:
        return state

    def measured(self, state: GEPAState) -> float | None:
        return None

    async def summary(self, run: PhaseRun[GEPAState], state: GEPAState) -> Summary:
        return dict(state.search)


async def alone(run: PhaseRun[GEPAState], state: GEPAState) -> GEPAState:
    """Optimize the run's system prompt; the seed is `gepa.seed_prompt`, else the run's
    `system_prompt`, else the scenario's default. Its journal (`gepa/`) is its resume."""
    ctx = run.ctx
    gepa_config = ctx.config.gepa
    scenario = one_scenario(ctx, "GEPA")
    seed_prompt = choose_seed_prompt(
        gepa=gepa_config.seed_prompt,
        run=ctx.config.system_prompt,
        scenario_default=scenario.default_system_prompt,
    )
    result, reports = await run_optimizer(
        ctx.model,
        scenario,
        seed_prompt=seed_prompt,
        config=gepa_config,
        run_dir=ctx.files.root / "gepa",
        on_event=lambda e: ctx.files.append_event(event_metrics(e, ctx)),
    )
    for name, prompt in (
        ("val_seed_prompt", result.seed_prompt),
        ("val_best_prompt", result.best_prompt),
    ):
        if prompt in reports:
            ctx.files.write_trajectories(name, reports[prompt].groups)
    summary = result.summary()
    ctx.files.append_metrics(
        {
            "event": "gepa_done",
            **{k: v for k, v in summary.items() if not isinstance(v, dict | str)},
            "wall_seconds": time.monotonic() - ctx.started,
            "cpu_seconds": cpu_seconds() - ctx.cpu_started,
        }
    )
    log.info(
        "GEPA: val accuracy %s (seed) -> %s (best), %d/%d metric calls, %d reflection calls "
        "(%d errors)",
        summary["val_accuracy_before"],
        summary["val_accuracy_after"],
        summary["metric_calls_used"],
        summary["max_metric_calls"],
        summary["reflection_calls"],
        summary["reflection_errors"],
    )
    return state.model_copy(update={"search": summary})


async def in_list(run: PhaseRun[GEPAState], state: GEPAState) -> GEPAState:
    """Optimise `s` with the weights as they are; adopt the best candidate if it beats `s`."""
    ctx, phase = run.ctx, run.entry
    cfg = ctx.config
    old = run.prompt or ""
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
            "metric_calls": state.metric_calls + result.metric_calls_used,
            "reflection_calls": state.reflection_calls + result.reflection.get("calls", 0),
            "reflection_errors": state.reflection_errors + result.reflection.get("error_total", 0),
            "frontier": [c.prompt for c in result.frontier if c.prompt != best.prompt][
                : cfg.gepa.pool_size - 1
            ],
        }
    )
    if best.prompt == old:
        log.info("round %d: GEPA kept s (Pareto mean %.3f)", phase.round, seed.mean)
        return state
    change = PromptChangeEvent(
        round=phase.round,
        phase=run.index,
        step=await ctx.model.get_step(),
        old=old,
        new=best.prompt,
        old_pareto_mean=seed.mean,
        new_pareto_mean=best.mean,
        origin=best.origin,
        old_val_accuracy=result.seed_val_accuracy,
        new_val_accuracy=result.best_val_accuracy,
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
    return state.model_copy(update={"prompt_changes": [*state.prompt_changes, change]})
