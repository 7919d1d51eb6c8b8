"""The GEPA loop of a run: evolve the system prompt, log every proposal, report on val.

Same shape as `run_rl`: state lives in the run folder (`<run>/gepa/`), a killed run re-run in
the same folder resumes (see art_rlvr.gepa.optimizer), and the returned dict goes into the
run's summary.json. Files written: `gepa/prompt_history.jsonl` (every proposal with its
parent, minibatch scores before/after, accepted or why not), `gepa/frontier.json`,
`gepa/result.json`, `metrics.jsonl` events, and the val trajectories of the seed and best
prompts under `trajectories/`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from art_rlvr.gepa.config import GEPAConfig
from art_rlvr.gepa.data import HistoryEvent
from art_rlvr.gepa.optimizer import run_optimizer
from art_rlvr.gepa.start import choose_seed_prompt
from art_rlvr.loops.context import RunContext, clocks, one_scenario
from art_rlvr.observe.clock import cpu_seconds
from art_rlvr.rundir.events import GepaEvent

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


async def run_gepa(ctx: RunContext, gepa_config: GEPAConfig) -> dict[str, Any]:
    """Optimize the run's system prompt; the seed is `gepa_config.seed_prompt`, else the run's
    `system_prompt`, else the task's default."""
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
    return summary
