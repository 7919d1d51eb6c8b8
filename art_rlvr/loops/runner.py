"""One runner for every run: the run's list of phases (`RunConfig.plan`), whatever the mode.

A list of one phase runs that phase's own loop with its own state file (`mode=rl` is `rl:N`
in `loops.rl`, `mode=ei` is `ei:N` in `loops.ei`, `mode=gepa` is `gepa` in `loops.gepa`,
`mode=eval` is `eval` in `loops.evaluate`), so a one-phase run reads and writes what those
modes always have. A longer list runs in the schedule (`loops.schedule`), which hands each
phase to the same code one phase at a time and keeps the list's place in its state.
"""

from __future__ import annotations

from typing import Any

from art_rlvr.loops.context import RunContext


async def run_phases(ctx: RunContext) -> dict[str, Any]:
    """Run (or resume) the run's phases; the dict goes into summary.json."""
    cfg = ctx.config
    phases = cfg.plan
    if len(phases) != 1:
        from art_rlvr.loops.schedule import run_schedule

        return await run_schedule(ctx, phases)
    (phase,) = phases
    if phase.kind == "eval":
        from art_rlvr.loops.evaluate import sampled_eval

        return await sampled_eval(
            cfg,
            ctx.scenario,
            ctx.files,
            ctx.model,
            ctx.started,
            ctx.cpu_started,
            system_prompt=cfg.system_prompt,
        )
    if phase.kind == "gepa":
        from art_rlvr.loops.gepa import run_gepa

        return await run_gepa(ctx, cfg.gepa)
    if phase.kind == "ei":
        from art_rlvr.loops.ei import run_ei

        return await run_ei(ctx, cfg.ei.model_copy(update={"rounds": phase.count}))
    from art_rlvr.loops.rl import run_rl

    return await run_rl(ctx, steps=phase.count)
