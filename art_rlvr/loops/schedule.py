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
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from art_rlvr.gepa.start import choose_seed_prompt
from art_rlvr.loops.context import RunContext, run_eval
from art_rlvr.loops.rl import spend, train_until
from art_rlvr.records import PromptChangeEvent
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
        gepa=gepa, run=cfg.system_prompt, task_default=ctx.task.default_system_prompt
    )


async def gepa_phase(
    ctx: RunContext, state: dict[str, Any], phase: Phase, index: int
) -> dict[str, Any]:
    """Optimise `s` with the weights as they are; adopt the best candidate if it beats `s`."""
    from art_rlvr.gepa.optimizer import run_optimizer
    from art_rlvr.loops.gepa import event_metrics

    cfg = ctx.config
    old = state["prompt"]
    config = cfg.gepa.model_copy(update={"seed": cfg.gepa.seed * 1000 + phase.round})
    result, _ = await run_optimizer(
        ctx.model,
        ctx.task,
        seed_prompt=old,
        config=config,
        run_dir=ctx.files.root / "gepa" / f"round_{phase.round}",
        on_event=lambda e: ctx.files.append_event(event_metrics(e, ctx, phase.round)),
        carry=state.get("frontier", []),
    )
    seed = result.candidates[0]
    best = next(c for c in result.candidates if c.index == result.best_index)
    state["gepa_metric_calls"] = state.get("gepa_metric_calls", 0) + result.metric_calls_used
    state["reflection_calls"] = state.get("reflection_calls", 0) + result.reflection.get("calls", 0)
    state["reflection_errors"] = state.get("reflection_errors", 0) + result.reflection.get(
        "error_total", 0
    )
    state["frontier"] = [c.prompt for c in result.frontier if c.prompt != best.prompt][
        : cfg.gepa.pool_size - 1
    ]
    if best.prompt != old:
        change = {
            "round": phase.round,
            "phase": index,
            "step": await ctx.model.get_step(),
            "old": old,
            "new": best.prompt,
            "old_pareto_mean": seed.mean,
            "new_pareto_mean": best.mean,
            "origin": best.origin,
            "old_val_accuracy": result.seed_val_accuracy,
            "new_val_accuracy": result.best_val_accuracy,
        }
        state["prompt_changes"] = [*state.get("prompt_changes", []), change]
        state["prompt"] = best.prompt
        ctx.files.append_event(PromptChangeEvent(**change))
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


async def rl_phase(ctx: RunContext, state: dict[str, Any], phase: Phase) -> dict[str, Any]:
    """`rl_batches_per_round` RL steps with `s` held fixed (the target step is saved first, so
    a resumed phase trains exactly the steps it has left)."""
    if state.get("phase_target") is None:
        state["phase_target"] = await ctx.model.get_step() + ctx.config.rl_batches_per_round
        ctx.files.write_json("state.json", state)
    return await train_until(
        ctx,
        state,
        until=state["phase_target"],
        system_prompt=state["prompt"],
        eval_at=lambda _step: False,
    )


async def ei_phase(ctx: RunContext, state: dict[str, Any], phase: Phase) -> dict[str, Any]:
    """One expert-iteration round under the current `s`: sample, (hint,) relabel, distil."""
    from art_rlvr.ei.expert import collect_round
    from art_rlvr.ei.files import write_round_records
    from art_rlvr.ei.hints import make_teacher
    from art_rlvr.ei.records import RoundBuffer
    from art_rlvr.llm import LLMCounters
    from art_rlvr.loops.ei import book_round, distill_in_run

    cfg, ei = ctx.config, ctx.config.ei
    teacher = None
    if ei.enable_teacher_hints:
        counters = LLMCounters.restore(state.get("teacher_counters") or {})
        teacher, _ = make_teacher(ctx.model, ei, counters)
    step = await ctx.model.get_step()
    if state.get("phase_target") is None:  # the step before this round trains
        state["phase_target"] = step
        ctx.files.write_json("state.json", state)
    if step > state["phase_target"]:
        log.info("EI round %d had trained before the kill", phase.round)
        return state
    if state.get("ei_buffer") is not None:
        buffer = RoundBuffer.model_validate(state["ei_buffer"])
    else:
        output = await collect_round(
            ctx.model,
            ctx.task,
            ei,
            phase.round,
            system_prompt=state["prompt"],
            teacher=teacher,
            backend=ctx.backend,
            max_exceptions=cfg.max_exceptions,
        )
        buffer = output.buffer
        write_round_records(ctx.files, output, tag="_ei")
        state["ei_buffer"] = buffer.model_dump(mode="json")
        ctx.files.write_json("state.json", state)
    began = time.monotonic()
    metrics = await distill_in_run(ctx, buffer, ei)
    stats = buffer.stats.model_dump()
    book_round(
        ctx,
        buffer,
        step=await ctx.model.get_step(),
        train_metrics=metrics,
        seconds=time.monotonic() - began,
    )
    totals = state.get("ei_totals", {})
    for key in ("examples_distilled", "recovered", "hints_generated", "teacher_errors"):
        totals[key] = totals.get(key, 0) + stats[key]
    state["ei_totals"] = totals
    if teacher is not None:
        state["teacher_counters"] = teacher.counters.snapshot()
    return state


async def run_schedule(ctx: RunContext) -> dict[str, Any]:
    """Run (or resume) the GEPA / RL / EI schedule; the result goes into summary.json."""
    cfg = ctx.config
    phases = plan(
        cfg.rounds,
        gepa=cfg.mode in ("gepa_rl", "gepa_rl_ei"),
        skip_first_gepa=cfg.skip_first_gepa,
        expert_iteration=cfg.with_expert_iteration,
    )
    keys = {"phase", "prompt", "evals", "curve"}
    state: dict[str, Any] = ctx.files.read_state("state.json", keys, "a schedule's") or {
        "phase": 0,
        "prompt": initial_prompt(ctx),
        "evals": {},
        "curve": [],
    }
    if state["phase"] >= len(phases):
        log.info("all %d phases of the schedule are done; finishing the summary", len(phases))
    elif state["phase"]:
        log.info("resuming the schedule at phase %d of %d", state["phase"] + 1, len(phases))
    log.info("schedule: %s", " -> ".join(p.label for p in phases))

    async def record(label: str, step: int) -> None:
        if label in state["evals"]:
            return
        report = await run_eval(ctx, step, system_prompt=state["prompt"], tag=f"_{label}")
        state["evals"][label] = report.accuracy
        state["curve"] = [*state["curve"], {"after": label, "step": step, "val": report.accuracy}]
        ctx.files.write_json("state.json", state)

    await record("start", await ctx.model.get_step())
    for index, phase in enumerate(phases):
        if index < state["phase"]:  # done; its evaluation too, unless a kill came between
            await record(phase.label, await ctx.model.get_step())
            continue
        log.info(
            "phase %d/%d: %s (s: %s)",
            index + 1,
            len(phases),
            phase.label,
            excerpt(state["prompt"], 80),
        )
        if phase.kind == "gepa":
            state = await gepa_phase(ctx, state, phase, index)
        elif phase.kind == "rl":
            state = await rl_phase(ctx, state, phase)
        else:
            state = await ei_phase(ctx, state, phase)
        state |= {"phase": index + 1, "phase_target": None, "ei_buffer": None}
        ctx.files.write_json("state.json", state)
        await record(phase.label, await ctx.model.get_step())
    step = await ctx.model.get_step()
    summary: dict[str, Any] = {
        "val_accuracy_before": state["evals"].get("start"),
        "val_accuracy_after": state["curve"][-1]["val"] if state["curve"] else None,
        "steps": step,
        **spend(state),
        "phases": [p.label for p in phases],
        "curve": state["curve"],
        "final_prompt": state["prompt"],
        "prompt_changes": len(state.get("prompt_changes", [])),
        "metric_calls_used": state.get("gepa_metric_calls", 0),
        "reflection_calls": state.get("reflection_calls", 0),
        "reflection_errors": state.get("reflection_errors", 0),
    }
    if cfg.with_expert_iteration:
        # the same names as mode=ei's summary (`teacher_errors`: scenarios whose teacher call
        # failed after retries), so the end-of-run summary and the report read them
        summary |= {k: v for k, v in state.get("ei_totals", {}).items()}
        counters = state.get("teacher_counters") or {}
        summary["teacher_calls"] = counters.get("calls", 0)
    if cfg.eval_test and ctx.task.splits["test"]:
        report = await run_eval(ctx, step, split="test", system_prompt=state["prompt"])
        summary["test_accuracy_after"] = report.accuracy
    return summary
