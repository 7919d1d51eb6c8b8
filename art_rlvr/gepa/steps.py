"""The two kinds of iteration (gepa's `proposer/reflective_mutation` and `proposer/merge`),
and what becomes of their child: admitted to the pool (scored on the Pareto set) or refused.

Each step first checks that the budget covers its worst case, so the budget is never passed;
a step that cannot afford itself stops the run before spending anything.
"""

from __future__ import annotations

import logging
import random
import statistics
from collections.abc import Sequence

from art_rlvr.gepa.data import (
    Candidate,
    ExampleEval,
    GEPAState,
    Rejection,
    RejectionKind,
)
from art_rlvr.gepa.pareto import eviction, frontier_indices, select_parent
from art_rlvr.gepa.propose import IterationFacts, Run, propose, stop
from art_rlvr.gepa.reflection import (
    gold_answers_for_leak_check,
    merge_messages,
    reflection_messages,
    reflective_records,
)
from art_rlvr.scenarios.scenario import Example, batch_examples

log = logging.getLogger(__name__)


def mean_score(evals: Sequence[ExampleEval]) -> float:
    return statistics.fmean(ev.score for ev in evals) if evals else 0.0


def budget_stop(run: Run, state: GEPAState, need: int) -> GEPAState:
    return stop(
        state,
        f"budget: an iteration could need {need} metric calls, "
        f"{run.store.remaining} of {run.config.max_metric_calls} left",
    )


async def score_starts(run: Run, state: GEPAState, starts: Sequence[str]) -> GEPAState:
    """The initial pool: the seed and any carried prompts, scored on the Pareto set (refused
    up front if the budget cannot cover even that)."""
    need = sum(run.cost(p, run.pareto) for p in starts)
    if need > run.store.remaining:
        raise ValueError(
            f"max_metric_calls={run.config.max_metric_calls} cannot even score the "
            f"{len(starts)} starting prompt(s) on the Pareto set ({need} calls)"
        )
    initial = []
    for index, prompt in enumerate(starts):
        evals = await run.adapter.aevaluate(run.pareto, prompt)
        initial.append(
            Candidate(
                index=index,
                prompt=prompt,
                origin="seed" if index == 0 else "carried",
                pareto_scores={e.scenario_id: e.score for e in evals},
            )
        )
        log.info(
            "%s prompt: Pareto mean %.3f over %d scenarios",
            "seed" if index == 0 else f"carried #{index}",
            initial[-1].mean,
            len(run.pareto),
        )
    return state.model_copy(
        update={"candidates": tuple(initial), "pool": tuple(range(len(initial)))}
    )


async def admit(
    run: Run,
    state: GEPAState,
    prompt: str,
    *,
    kind: str,
    base: IterationFacts,
    score_after: float,
) -> GEPAState:
    """Score an accepted child on the Pareto set and add it to the pool (capped)."""
    cfg = run.config
    discovered_at = run.store.spent
    evals = await run.adapter.aevaluate(run.pareto, prompt)
    candidate = Candidate(
        index=len(state.candidates),
        prompt=prompt,
        parents=tuple(base["parents"]),
        origin="merge" if kind == "merge" else "reflection",
        iteration=base["iteration"],
        pareto_scores={ev.scenario_id: ev.score for ev in evals},
        metric_calls_at_discovery=discovered_at,
    )
    grown = state.model_copy(
        update={
            "candidates": (*state.candidates, candidate),
            "pool": (*state.pool, candidate.index),
        }
    )
    victim = eviction(grown, cfg.pool_size)
    pool = tuple(i for i in grown.pool if i != victim)
    merges_due = state.merges_due
    if (
        cfg.use_merge
        and kind != "merge"
        and state.merges_done + merges_due < cfg.max_merge_attempts
    ):
        merges_due += 1
    log.info(
        "iteration %d: accepted candidate #%d (minibatch %.3f -> %.3f, Pareto mean %.3f)",
        base["iteration"],
        candidate.index,
        base["score_before"],
        score_after,
        candidate.mean,
    )
    event = run.event(
        kind=kind,
        prompt=prompt,
        score_after=score_after,
        accepted=True,
        reason="beat its parent(s) on the minibatch",
        candidate=candidate.index,
        pareto_mean=candidate.mean,
        evicted=victim,
        **base,
    )
    return grown.model_copy(
        update={
            "pool": pool,
            "history": (*grown.history, event),
            "merges_due": merges_due,
            "counts": grown.count("accepted"),
        }
    )


def refuse(
    run: Run,
    state: GEPAState,
    prompt: str,
    reason: str,
    *,
    kind: str,
    base: IterationFacts,
    score_after: float,
) -> GEPAState:
    """An evaluated child that did not beat its parent(s): remembered, never re-proposed."""
    event = run.event(
        prompt=prompt,
        reason=reason,
        rejection=RejectionKind.NO_IMPROVEMENT,
        kind=kind,
        score_after=score_after,
        **base,
    )
    log.info("iteration %d: rejected: %s", base["iteration"], reason)
    rejection = Rejection(iteration=base["iteration"], prompt=prompt, reason=reason)
    return state.model_copy(
        update={
            "history": (*state.history, event),
            "rejections": (*state.rejections, rejection),
            "counts": state.count("rejected_after_eval"),
        }
    )


def leak_answers(run: Run, minibatch: Sequence[Example]) -> list[str]:
    """The shown examples' gold answers a proposal must not copy (none if the check is off)."""
    cfg = run.config
    return gold_answers_for_leak_check(minibatch, cfg.answer_field) if cfg.leak_check else []


async def reflective_step(run: Run, state: GEPAState) -> GEPAState:
    """Mutate a Pareto-sampled parent by reflecting on its failures on minibatch `iteration`."""
    cfg = run.config
    i = state.iteration
    parent = state.candidates[select_parent(state, random.Random(f"gepa-select:{cfg.seed}:{i}"))]
    minibatch = batch_examples(run.feedback, cfg.traces_per_iteration, cfg.seed, i)
    need = (
        run.cost(parent.prompt, minibatch) + run.cost(None, minibatch) + run.cost(None, run.pareto)
    )
    if need > run.store.remaining:
        return budget_stop(run, state, need)
    before_evals = await run.adapter.aevaluate(minibatch, parent.prompt)
    before = mean_score(before_evals)
    base: IterationFacts = {
        "iteration": i,
        "parents": (parent.index,),
        "minibatch": tuple(example.id for example in minibatch),
        "score_before": before,
    }
    if all(ev.perfect for ev in before_evals):
        streak = state.perfect_streak + 1
        reason = (
            f"parent #{parent.index} got full reward on every rollout of this minibatch: "
            f"no failure to reflect on ({streak} in a row)"
        )
        log.warning("iteration %d: %s", i, reason)
        state = state.model_copy(
            update={
                "history": (
                    *state.history,
                    run.event(kind="perfect_minibatch", reason=reason, **base),
                ),
                "perfect_streak": streak,
                "counts": state.count("perfect_minibatches"),
            }
        )
        if streak >= cfg.max_perfect_streak:
            state = stop(state, f"perfect: {streak} minibatches in a row had nothing to improve")
        return state
    state = state.model_copy(update={"perfect_streak": 0})
    dataset = reflective_records(before_evals, cfg.max_reflection_examples, cfg.max_episode_chars)
    state, prompt = await propose(
        run,
        state,
        key=str(i),
        kind="reflection",
        build=lambda shown: reflection_messages(
            parent.prompt, dataset, shown, cfg.max_prompt_chars
        ),
        parent_prompts=(parent.prompt,),
        answers=leak_answers(run, minibatch),
        base=base,
    )
    if prompt is None:
        return state
    after = mean_score(await run.adapter.aevaluate(minibatch, prompt))
    if after - before > cfg.min_improvement_threshold:
        return await admit(run, state, prompt, kind="reflection", base=base, score_after=after)
    reason = (
        f"minibatch score {after:.3f} vs its parent's {before:.3f}: not above it by more than "
        f"{cfg.min_improvement_threshold:g}"
    )
    return refuse(run, state, prompt, reason, kind="reflection", base=base, score_after=after)


async def merge_step(run: Run, state: GEPAState) -> tuple[GEPAState, bool]:
    """gepa's merge, for a one-component candidate: crossing components is a no-op, so the
    reflection LM is asked to combine two frontier prompts. (state, whether it used the
    iteration)."""
    cfg = run.config
    i = state.iteration
    front = frontier_indices(state)
    if len(front) < 2:
        event = run.event(
            iteration=i,
            kind="merge_skipped",
            reason=f"the frontier has {len(front)} candidate(s); a merge needs two",
        )
        return state.model_copy(update={"merges_due": 0, "history": (*state.history, event)}), False
    a, b = sorted(random.Random(f"gepa-merge:{cfg.seed}:{i}").sample(front, 2))
    pa, pb = state.candidates[a].prompt, state.candidates[b].prompt
    minibatch = batch_examples(run.feedback, cfg.traces_per_iteration, cfg.seed, i)
    need = (
        run.cost(pa, minibatch)
        + run.cost(pb, minibatch)
        + run.cost(None, minibatch)
        + run.cost(None, run.pareto)
    )
    if need > run.store.remaining:
        return budget_stop(run, state, need), True
    sa = mean_score(await run.adapter.aevaluate(minibatch, pa))
    sb = mean_score(await run.adapter.aevaluate(minibatch, pb))
    state = state.model_copy(
        update={"merges_due": state.merges_due - 1, "merges_done": state.merges_done + 1}
    )
    base: IterationFacts = {
        "iteration": i,
        "parents": (a, b),
        "minibatch": tuple(example.id for example in minibatch),
        "parent_scores": (sa, sb),
        "score_before": max(sa, sb),
    }
    state, prompt = await propose(
        run,
        state,
        key=f"{i}:merge",
        kind="merge",
        build=lambda shown: merge_messages(pa, pb, shown, cfg.max_prompt_chars),
        parent_prompts=(pa, pb),
        answers=leak_answers(run, minibatch),
        base=base,
    )
    if prompt is None:
        return state, True
    after = mean_score(await run.adapter.aevaluate(minibatch, prompt))
    if after - max(sa, sb) >= cfg.min_improvement_threshold:
        return await admit(run, state, prompt, kind="merge", base=base, score_after=after), True
    reason = f"minibatch score {after:.3f} below the better parent's {max(sa, sb):.3f}"
    return refuse(run, state, prompt, reason, kind="merge", base=base, score_after=after), True
