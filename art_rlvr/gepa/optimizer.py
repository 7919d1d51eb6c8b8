"""GEPA's reflective-mutation loop, driven by us on top of gepa's building blocks.

Why not `gepa.optimize` (0.1.4): its budget check runs between iterations, so a run overshoots
`max_metric_calls`; a resumed run re-evaluates the seed without counting it and loses its RNG
and sampler position; a truncated reply is adopted as a prompt; a rejected proposal is
forgotten and retried; all-perfect minibatches are skipped silently; reflection errors are
logged and swallowed. Here the loop is ours and gepa supplies the parts that were right: the
Pareto-front candidate selection (`select_program_candidate_from_pareto_front`), dominance
pruning (`find_dominator_programs`), the reflection prompt renderer and the adapter protocol.

One iteration: pick a parent from the Pareto front (RNG seeded by (seed, iteration)), take
minibatch `iteration` of a seeded per-epoch shuffle of the feedback pool, evaluate the parent,
ask the reflection LM for a better prompt (re-asking, up to `max_reflection_attempts`, when a
reply is unusable), evaluate the child on the same minibatch, and admit it to the pool (scored
on the Pareto set) only if it beats its parent by more than `min_improvement_threshold`.
An iteration starts only if the budget covers its worst case, so the budget is never passed.

Resume: evaluations and reflection replies are journaled as they happen; decisions are written
atomically at iteration boundaries. A killed run replays its unfinished iteration from the
journal (same parent, same minibatch, same replies) without paying twice, so it ends exactly
where an uninterrupted run with the same seed and replies would.

The parts, along gepa's own seams: `pareto` (frontier, parent selection, eviction), `propose`
(reflection calls, re-asking until the proposal check passes), `steps` (reflective mutation,
merge, admission), `store` (journal, evaluation store, run folder), `result`, `start` (seed
prompt, split, fingerprint, resume). This module is the loop that wires them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import art

from art_rlvr.eval.evaluate import EvalReport, evaluate
from art_rlvr.gepa.adapter import ARTPromptAdapter
from art_rlvr.gepa.config import GEPAConfig
from art_rlvr.gepa.data import GEPAState, HistoryEvent
from art_rlvr.gepa.pareto import frontier_indices
from art_rlvr.gepa.propose import ReflectionCalls, Run, journaled_replies, stop
from art_rlvr.gepa.result import GEPAResult
from art_rlvr.gepa.start import choose_seed_prompt, fingerprint, reopen, split_train
from art_rlvr.gepa.steps import merge_step, reflective_step, score_starts
from art_rlvr.gepa.store import EvalStore, GEPAFiles
from art_rlvr.llm.client import LLMClient, LLMCounters, client_for
from art_rlvr.observe import tracing
from art_rlvr.rollouts.sampling import SamplingConfig, rollout_seed
from art_rlvr.scenarios.scenario import Scenario

__all__ = ["GEPAResult", "make_reflector", "optimize_prompt", "report_prompts", "run_optimizer"]

log = logging.getLogger(__name__)


@tracing.op(
    "art_rlvr.gepa.iteration",
    inputs=tracing.gepa_iteration_inputs,
    output=tracing.gepa_iteration_output,
)
async def _iteration(run: Run, state: GEPAState) -> GEPAState:
    if run.config.use_merge and state.merges_due > 0:
        state, used = await merge_step(run, state)
        if used:
            return (
                state
                if state.stop_reason
                else state.model_copy(update={"iteration": state.iteration + 1})
            )
    state = await reflective_step(run, state)
    if state.stop_reason and state.stop_reason.startswith("budget"):
        return state  # nothing of this iteration happened
    return state.model_copy(update={"iteration": state.iteration + 1})


def make_reflector(
    model: art.Model, config: GEPAConfig, counters: LLMCounters
) -> tuple[LLMClient, str]:
    """The configured reflection LM, or the embedded model through its own endpoint."""
    return client_for(config.reflection, model, name="reflection", counters=counters)


def open_state(files: GEPAFiles, config: GEPAConfig, fp: str) -> GEPAState:
    """The folder's state if it holds this run (reopened), a fresh one if it holds none."""
    state = files.load_state()
    if state is None:
        return GEPAState(fingerprint=fp)
    if state.fingerprint != fp:
        raise ValueError(
            f"{files.root} holds a GEPA run with other settings (seed, sizes, seed prompt or "
            "task differ); use a new folder to start over"
        )
    log.info("resuming GEPA at iteration %d (%s)", state.iteration, files.root)
    return reopen(state, config)


async def report_prompts(
    model: art.Model, scenario: Scenario, prompts: Sequence[str], config: GEPAConfig
) -> dict[str, EvalReport]:
    """Greedy val accuracy of each distinct prompt (outside the optimization budget)."""
    val = scenario.splits["val"]
    if config.report_val_limit == 0 or not val:
        return {}
    examples = val[: config.report_val_limit] if config.report_val_limit else val
    sampling = SamplingConfig(
        max_tokens=config.report_max_tokens or config.max_tokens, temperature=0.0
    )
    return {
        p: await evaluate(model, examples, system_prompt=p, sampling=sampling, split="val")
        for p in dict.fromkeys(prompts)
    }


async def run_optimizer(
    model: art.Model,
    scenario: Scenario,
    *,
    seed_prompt: str | None = None,
    config: GEPAConfig,
    run_dir: Path | str | None = None,
    on_event: Callable[[HistoryEvent], object] | None = None,
    carry: Sequence[str] = (),
) -> tuple[GEPAResult, dict[str, EvalReport]]:
    """The whole run; returns the result and the val reports behind its accuracies.

    `carry`: prompts kept from an earlier phase (GEPA + RL keeps its frontier across rounds);
    they join the seed in the initial pool and are re-scored, within the budget, because the
    weights they were scored with have changed."""
    cfg = config
    began = time.monotonic()
    seed_prompt = choose_seed_prompt(
        given=seed_prompt, gepa=cfg.seed_prompt, scenario_default=scenario.default_system_prompt
    )
    if len(seed_prompt) > cfg.max_prompt_chars:
        raise ValueError(f"the seed prompt is over max_prompt_chars={cfg.max_prompt_chars}")
    files = GEPAFiles(Path(run_dir) if run_dir is not None else None)
    pareto, feedback = split_train(scenario.splits["train"], cfg.pareto_size, cfg.seed)
    starts = list(dict.fromkeys([seed_prompt, *carry]))
    fp = fingerprint(cfg, scenario, "\n---\n".join(starts), [example.id for example in pareto])
    state = open_state(files, cfg, fp)
    replies, counters = journaled_replies(files.journal)
    store = EvalStore(cfg.max_metric_calls, files.journal)
    client, reflector = make_reflector(model, cfg, counters)
    adapter = ARTPromptAdapter(
        model,
        store,
        sampling=SamplingConfig(
            max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p
        ),
        group_size=cfg.group_size,
        seed=rollout_seed(cfg.seed, "gepa"),
        max_reflection_examples=cfg.max_reflection_examples,
        max_episode_chars=cfg.max_episode_chars,
        loop=asyncio.get_running_loop(),
    )
    reflection = ReflectionCalls(client, files.journal, replies)
    run = Run(cfg, adapter, store, reflection, pareto, feedback)
    if not state.candidates:
        state = await score_starts(run, state, starts)
        files.save(state)
    while state.stop_reason is None:
        if cfg.max_iterations is not None and state.iteration >= cfg.max_iterations:
            state = stop(state, f"max_iterations: {cfg.max_iterations} iterations done")
            break
        seen = len(state.history)
        state = await _iteration(run, state)
        files.save(state)
        for event in state.history[seen:]:
            if on_event is not None:
                on_event(event)
    files.save(state)
    if store.spent > cfg.max_metric_calls:  # cannot happen: every evaluation reserves first
        raise AssertionError(f"budget exceeded: {store.spent} > {cfg.max_metric_calls}")
    best = state.best
    reports = await report_prompts(model, scenario, [seed_prompt, best.prompt], cfg)
    result = GEPAResult(
        best_prompt=best.prompt,
        best_index=best.index,
        seed_prompt=seed_prompt,
        frontier=tuple(state.candidates[i] for i in frontier_indices(state)),
        candidates=state.candidates,
        history=state.history,
        iterations=state.iteration,
        stop_reason=state.stop_reason or "",
        metric_calls_used=store.spent,
        max_metric_calls=cfg.max_metric_calls,
        reflector=reflector,
        reflection=client.counters.snapshot(),
        counts=dict(state.counts),
        seed_val_accuracy=reports[seed_prompt].accuracy if reports else None,
        best_val_accuracy=reports[best.prompt].accuracy if reports else None,
        val_n=next(iter(reports.values())).n if reports else 0,
        report_rollouts=sum(r.n for r in reports.values()),
        run_dir=str(files.root) if files.root else None,
    )
    files.write_result(result)
    log.info(
        "GEPA done in %.1fs: %d iterations, %d/%d metric calls, best #%d (val %s vs seed %s)",
        time.monotonic() - began,
        result.iterations,
        result.metric_calls_used,
        result.max_metric_calls,
        best.index,
        result.best_val_accuracy,
        result.seed_val_accuracy,
    )
    return result, reports


async def optimize_prompt(
    model: art.Model,
    scenario: Scenario,
    *,
    seed_prompt: str | None = None,
    config: GEPAConfig | None = None,
    run_dir: Path | str | None = None,
    carry: Sequence[str] = (),
) -> GEPAResult:
    """Evolve `seed_prompt` (default: the config's, else the scenario's) for `model` on
    `scenario` (`carry`: more starting prompts, e.g. an earlier frontier).

    For notebooks: `result = await optimize_prompt(model, scenario, config=GEPAConfig(...))`.
    With `run_dir`, the run is journaled there and resumes where it stopped."""
    result, _ = await run_optimizer(
        model,
        scenario,
        seed_prompt=seed_prompt,
        config=config or GEPAConfig(),
        run_dir=run_dir,
        carry=carry,
    )
    return result
