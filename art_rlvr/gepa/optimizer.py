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
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import art
from gepa.gepa_utils import find_dominator_programs, select_program_candidate_from_pareto_front
from pydantic import BaseModel, ConfigDict, ValidationError

from art_rlvr.gepa.adapter import ARTPromptAdapter, EvalStore, Journal
from art_rlvr.gepa.config import GEPAConfig
from art_rlvr.gepa.proposal import (
    check_proposal,
    gold_answers_for_leak_check,
    merge_messages,
    normalize,
    reflection_messages,
    reflective_records,
)
from art_rlvr.gepa.records import (
    Candidate,
    GEPAState,
    HistoryEvent,
    Rejection,
    ScenarioEval,
)
from art_rlvr.llm import (
    LLMClient,
    LLMCounters,
    LLMError,
    LLMReply,
    client_for,
)
from art_rlvr.loops.evaluate import EvalReport, evaluate
from art_rlvr.loops.files import RunFiles, StateFileError
from art_rlvr.loops.rl import batch_scenarios
from art_rlvr.observe import tracing
from art_rlvr.rollouts import SamplingConfig, rollout_seed
from art_rlvr.scenario import Scenario, Task

log = logging.getLogger(__name__)

# fields that shape the search; the budget, iteration cap, report and reflection transport may
# change between a run and its resume
_FINGERPRINT_EXCLUDE = {
    "max_metric_calls",
    "max_iterations",
    "max_consecutive_errors",
    "max_perfect_streak",
    "report_val_limit",
    "report_max_tokens",
}


class GEPAResult(BaseModel):
    """What a GEPA run found, what it cost, and how it compares on val."""

    model_config = ConfigDict(frozen=True)

    best_prompt: str
    best_index: int
    seed_prompt: str
    frontier: tuple[Candidate, ...]
    candidates: tuple[Candidate, ...]
    history: tuple[HistoryEvent, ...]
    iterations: int
    stop_reason: str
    metric_calls_used: int
    max_metric_calls: int
    reflector: str
    reflection: dict[str, Any]
    counts: dict[str, int]
    seed_val_accuracy: float | None = None
    best_val_accuracy: float | None = None
    val_n: int = 0
    report_rollouts: int = 0
    run_dir: str | None = None

    @property
    def accepted(self) -> tuple[HistoryEvent, ...]:
        return tuple(e for e in self.history if e.accepted)

    def summary(self) -> dict[str, Any]:
        """Flat fields for a run's summary.json."""
        rejected: dict[str, int] = {}
        for e in self.history:
            if e.kind in ("reflection", "merge") and not e.accepted:
                kind = _reason_kind(e.reason)
                rejected[kind] = rejected.get(kind, 0) + 1
        return {
            "best_prompt": self.best_prompt,
            "seed_prompt": self.seed_prompt,
            "val_accuracy_before": self.seed_val_accuracy,
            "val_accuracy_after": self.best_val_accuracy,
            "val_n": self.val_n,
            "metric_calls_used": self.metric_calls_used,
            "max_metric_calls": self.max_metric_calls,
            "iterations": self.iterations,
            "candidates": len(self.candidates),
            "accepted": len(self.accepted),
            "rejected": rejected,
            "frontier_size": len(self.frontier),
            "stop_reason": self.stop_reason,
            "reflector": self.reflector,
            "reflection_calls": self.reflection.get("calls", 0),
            "reflection_errors": self.reflection.get("error_total", 0),
            "reflection_failed_calls": self.reflection.get("failed", 0),
            "perfect_minibatches": self.counts.get("perfect_minibatches", 0),
            "report_rollouts": self.report_rollouts,
        }


def _reason_kind(reason: str) -> str:
    for marker, kind in (
        ("fenced", "no_fenced_prompt"),
        ("too long", "too_long"),
        ("copies the expected answer", "leak"),
        ("repeats an earlier", "repeat"),
        ("same as the instruction", "unchanged"),
        ("minibatch score", "no_improvement"),
        ("empty", "empty"),
    ):
        if marker in reason:
            return kind
    return "other"


# ------------------------------------------------------------------ pure helpers


def split_train(
    train: Sequence[Scenario], pareto_size: int, seed: int
) -> tuple[list[Scenario], list[Scenario]]:
    """A seeded Pareto set (scores candidates) and the disjoint feedback pool (minibatches),
    both from train, so the val split stays an honest held-out report."""
    if len(train) <= pareto_size:
        raise ValueError(
            f"the train split has {len(train)} scenarios; GEPA needs more than pareto_size="
            f"{pareto_size} (the rest feed the reflection minibatches)"
        )
    order = list(range(len(train)))
    random.Random(f"gepa-split:{seed}").shuffle(order)
    return [train[i] for i in order[:pareto_size]], [train[i] for i in order[pareto_size:]]


def fingerprint(config: GEPAConfig, task: Task, seed_prompt: str, pareto: Sequence[str]) -> str:
    shaping = {
        k: v
        for k, v in config.model_dump(mode="json").items()
        if k not in _FINGERPRINT_EXCLUDE and not k.startswith("reflection_")
    }
    blob = json.dumps([shaping, task.name, seed_prompt, list(pareto)], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def front_mapping(state: GEPAState) -> dict[str, set[int]]:
    """Pareto-set scenario -> the pool candidates with the best score on it."""
    pool = sorted(state.pool)
    ids = sorted(state.candidates[pool[0]].pareto_scores)
    mapping: dict[str, set[int]] = {}
    for sid in ids:
        best = max(state.candidates[i].pareto_scores[sid] for i in pool)
        mapping[sid] = {i for i in pool if state.candidates[i].pareto_scores[sid] == best}
    return mapping


def pool_means(state: GEPAState) -> dict[int, float]:
    return {i: state.candidates[i].mean for i in sorted(state.pool)}


def frontier_indices(state: GEPAState) -> list[int]:
    """Pool candidates that no other candidate dominates on the Pareto set (gepa's rule)."""
    return sorted(find_dominator_programs(front_mapping(state), pool_means(state)))


def select_parent(state: GEPAState, rng: random.Random) -> int:
    """gepa's Pareto sampling: a frontier candidate, weighted by how many scenarios it leads."""
    return select_program_candidate_from_pareto_front(front_mapping(state), pool_means(state), rng)


def eviction(state: GEPAState, pool_size: int) -> int | None:
    """Over the cap, drop the weakest dominated candidate (else the weakest but the best)."""
    if len(state.pool) <= pool_size:
        return None
    front = set(frontier_indices(state))
    best = max(state.pool, key=lambda i: (state.candidates[i].mean, -i))
    victims = [i for i in state.pool if i not in front and i != best] or [
        i for i in state.pool if i != best
    ]
    return min(victims, key=lambda i: (state.candidates[i].mean, i))


def known_prompts(
    rejections: Sequence[Rejection], candidates: Sequence[Candidate]
) -> dict[str, str]:
    """Normalised prompt -> why it must not be proposed again (shown to the reflection LM)."""
    known = {normalize(r.prompt): f"rejected: {r.reason}" for r in rejections}
    return known | {normalize(c.prompt): f"already candidate #{c.index}" for c in candidates}


def reopen(state: GEPAState, config: GEPAConfig) -> GEPAState:
    """A stopped run, re-run: budget and iteration stops are re-checked against the (maybe
    raised) limits before anything is spent; a reflector that failed is tried again; a run
    that ran out of failures to reflect on stays stopped unless `max_perfect_streak` grew."""
    stop = state.stop_reason or ""
    if stop.startswith("perfect") and state.perfect_streak >= config.max_perfect_streak:
        return state
    return state.model_copy(update={"stop_reason": None, "error_streak": 0})


def mean_score(evals: Sequence[ScenarioEval]) -> float:
    return statistics.fmean(ev.score for ev in evals) if evals else 0.0


def unique(scenarios: Sequence[Scenario]) -> list[Scenario]:
    return list({sc.id: sc for sc in scenarios}.values())


# ------------------------------------------------------------------ the run


class GEPAFiles:
    """The GEPA folder: state.json (decisions), journal.jsonl (write-ahead: evaluations and
    replies), prompt_history.jsonl, frontier.json and result.json. With no folder, nothing is
    written and nothing can be resumed."""

    def __init__(self, root: Path | None) -> None:
        self.files = RunFiles(root) if root is not None else None
        self.journal = Journal(root / "journal.jsonl" if root is not None else None)

    @property
    def root(self) -> Path | None:
        return self.files.root if self.files else None

    def load_state(self) -> GEPAState | None:
        data = self.files.read_json("state.json") if self.files else None
        if data is None:
            return None
        try:
            return GEPAState.model_validate(data)
        except ValidationError:
            raise StateFileError(
                f"{self.files.root / 'state.json'} is not a GEPA state (another mode's run?); "
                "use a new run_dir"
            ) from None

    def save(self, state: GEPAState) -> None:
        if self.files is None:
            return
        self.files.write_json("state.json", state.model_dump(mode="json"))
        write_jsonl_atomic(
            self.files.root / "prompt_history.jsonl",
            [e.model_dump(mode="json") for e in state.history],
        )
        self.files.write_json(
            "frontier.json",
            [state.candidates[i].model_dump(mode="json") for i in frontier_indices(state)],
        )

    def write_result(self, result: GEPAResult) -> None:
        if self.files is not None:
            self.files.write_json("result.json", result.model_dump(mode="json"))


def write_jsonl_atomic(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as handle:
        handle.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)


@dataclass
class _Run:
    config: GEPAConfig
    adapter: ARTPromptAdapter
    store: EvalStore
    journal: Journal
    client: LLMClient
    replies: dict[str, dict[str, Any]]
    pareto: list[Scenario]
    feedback: list[Scenario]

    def cost(self, prompt: str | None, scenarios: Sequence[Scenario]) -> int:
        """Metric calls to evaluate `prompt` on `scenarios` (None: a new prompt, nothing cached)."""
        todo = unique(scenarios) if prompt is None else self.store.missing(prompt, scenarios)
        return self.config.evaluation_cost(len(todo))

    async def reflect(self, key: str, messages: list[dict[str, str]]) -> LLMReply:
        """Ask the reflection LM, or replay what it said before a kill (journaled)."""
        if key in self.replies:
            done = self.replies[key]
            if "error" in done:
                e = done["error"]
                raise LLMError(e["message"], kind=e["kind"], status=e.get("status"))
            return LLMReply.model_validate(done["reply"])
        try:
            reply = await self.client.acomplete(messages)
        except LLMError as error:
            if not error.fatal:
                record = {
                    "error": {"message": str(error), "kind": error.kind, "status": error.status}
                }
                self._journal(key, record)
            raise
        self._journal(key, {"reply": reply.model_dump(mode="json")})
        return reply

    def _journal(self, key: str, record: dict[str, Any]) -> None:
        self.replies[key] = record
        self.journal.append(
            {
                "type": "reflection",
                "key": key,
                **record,
                "counters": self.client.counters.snapshot(),
            }
        )

    def event(self, **fields: Any) -> HistoryEvent:
        return HistoryEvent(metric_calls=self.store.spent, **fields)


def _stop(state: GEPAState, reason: str) -> GEPAState:
    log.info("GEPA stops: %s", reason)
    return state.model_copy(update={"stop_reason": reason})


def _budget_stop(run: _Run, state: GEPAState, need: int) -> GEPAState:
    return _stop(
        state,
        f"budget: an iteration could need {need} metric calls, "
        f"{run.store.remaining} of {run.config.max_metric_calls} left",
    )


async def _propose(
    run: _Run,
    state: GEPAState,
    *,
    key: str,
    kind: str,
    build: Callable[[Sequence[Rejection]], list[dict[str, str]]],
    parent_prompts: Sequence[str],
    answers: Sequence[str],
    base: dict[str, Any],
) -> tuple[GEPAState, str | None]:
    """Ask until a reply passes `check_proposal` (or attempts run out); every refused reply is
    a history event, and a refused prompt is remembered and shown on the next ask."""
    cfg = run.config
    history, rejections = list(state.history), list(state.rejections)
    counts = dict(state.counts)
    for attempt in range(1, cfg.max_reflection_attempts + 1):
        shown = rejections[-cfg.max_shown_rejections :] if cfg.max_shown_rejections else []
        try:
            reply = await run.reflect(f"{key}:{attempt}", build(shown))
        except LLMError as error:
            if error.fatal:
                raise
            streak = state.error_streak + 1
            log.error("iteration %d: reflection failed (%s); moving on", base["iteration"], error)
            history.append(
                run.event(kind="reflection_error", attempt=attempt, reason=str(error), **base)
            )
            counts["reflection_errors"] = counts.get("reflection_errors", 0) + 1
            state = state.model_copy(
                update={
                    "history": tuple(history),
                    "rejections": tuple(rejections),
                    "counts": counts,
                    "error_streak": streak,
                }
            )
            if streak >= cfg.max_consecutive_errors:
                state = _stop(state, f"reflection failed {streak} times in a row; last: {error}")
            return state, None
        known = known_prompts(rejections, state.candidates)
        prompt, reason = check_proposal(
            reply.text,
            reply.finish_reason,
            parents=parent_prompts,
            known=known,
            answers=answers,
            max_chars=cfg.max_prompt_chars,
        )
        if reason is None:
            assert prompt is not None
            return state.model_copy(
                update={
                    "history": tuple(history),
                    "rejections": tuple(rejections),
                    "counts": counts,
                    "error_streak": 0,
                }
            ), prompt
        log.info(
            "iteration %d attempt %d: proposal refused: %s", base["iteration"], attempt, reason
        )
        history.append(
            run.event(
                kind=kind,
                attempt=attempt,
                prompt=prompt,
                reason=reason,
                finish_reason=reply.finish_reason,
                **base,
            )
        )
        counts["refused_proposals"] = counts.get("refused_proposals", 0) + 1
        if prompt and normalize(prompt) not in known:
            rejections.append(Rejection(iteration=base["iteration"], prompt=prompt, reason=reason))
    state = state.model_copy(
        update={
            "history": tuple(history),
            "rejections": tuple(rejections),
            "counts": counts,
            "error_streak": 0,
        }
    )
    return state, None


async def _admit(
    run: _Run,
    state: GEPAState,
    prompt: str,
    *,
    kind: str,
    base: dict[str, Any],
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


def _refuse(run: _Run, state: GEPAState, prompt: str, reason: str, **fields: Any) -> GEPAState:
    event = run.event(prompt=prompt, reason=reason, **fields)
    log.info("iteration %d: rejected: %s", fields["iteration"], reason)
    rejection = Rejection(iteration=fields["iteration"], prompt=prompt, reason=reason)
    return state.model_copy(
        update={
            "history": (*state.history, event),
            "rejections": (*state.rejections, rejection),
            "counts": state.count("rejected_after_eval"),
        }
    )


async def _reflective(run: _Run, state: GEPAState) -> GEPAState:
    cfg = run.config
    i = state.iteration
    parent = state.candidates[select_parent(state, random.Random(f"gepa-select:{cfg.seed}:{i}"))]
    minibatch = batch_scenarios(run.feedback, cfg.traces_per_iteration, cfg.seed, i)
    need = (
        run.cost(parent.prompt, minibatch) + run.cost(None, minibatch) + run.cost(None, run.pareto)
    )
    if need > run.store.remaining:
        return _budget_stop(run, state, need)
    before_evals = await run.adapter.aevaluate(minibatch, parent.prompt)
    before = mean_score(before_evals)
    base: dict[str, Any] = {
        "iteration": i,
        "parents": (parent.index,),
        "minibatch": tuple(sc.id for sc in minibatch),
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
            state = _stop(state, f"perfect: {streak} minibatches in a row had nothing to improve")
        return state
    state = state.model_copy(update={"perfect_streak": 0})
    dataset = reflective_records(before_evals, cfg.max_reflection_examples)
    answers = gold_answers_for_leak_check(minibatch, cfg.answer_field) if cfg.leak_check else []
    state, prompt = await _propose(
        run,
        state,
        key=str(i),
        kind="reflection",
        build=lambda shown: reflection_messages(
            parent.prompt, dataset, shown, cfg.max_prompt_chars
        ),
        parent_prompts=(parent.prompt,),
        answers=answers,
        base=base,
    )
    if prompt is None:
        return state
    after = mean_score(await run.adapter.aevaluate(minibatch, prompt))
    if after - before > cfg.min_improvement_threshold:
        return await _admit(run, state, prompt, kind="reflection", base=base, score_after=after)
    reason = (
        f"minibatch score {after:.3f} vs its parent's {before:.3f}: not above it by more than "
        f"{cfg.min_improvement_threshold:g}"
    )
    return _refuse(run, state, prompt, reason, kind="reflection", score_after=after, **base)


async def _merge(run: _Run, state: GEPAState) -> tuple[GEPAState, bool]:
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
    minibatch = batch_scenarios(run.feedback, cfg.traces_per_iteration, cfg.seed, i)
    need = (
        run.cost(pa, minibatch)
        + run.cost(pb, minibatch)
        + run.cost(None, minibatch)
        + run.cost(None, run.pareto)
    )
    if need > run.store.remaining:
        return _budget_stop(run, state, need), True
    sa = mean_score(await run.adapter.aevaluate(minibatch, pa))
    sb = mean_score(await run.adapter.aevaluate(minibatch, pb))
    state = state.model_copy(
        update={"merges_due": state.merges_due - 1, "merges_done": state.merges_done + 1}
    )
    base: dict[str, Any] = {
        "iteration": i,
        "parents": (a, b),
        "minibatch": tuple(sc.id for sc in minibatch),
        "parent_scores": (sa, sb),
        "score_before": max(sa, sb),
    }
    answers = gold_answers_for_leak_check(minibatch, cfg.answer_field) if cfg.leak_check else []
    state, prompt = await _propose(
        run,
        state,
        key=f"{i}:merge",
        kind="merge",
        build=lambda shown: merge_messages(pa, pb, shown, cfg.max_prompt_chars),
        parent_prompts=(pa, pb),
        answers=answers,
        base=base,
    )
    if prompt is None:
        return state, True
    after = mean_score(await run.adapter.aevaluate(minibatch, prompt))
    if after - max(sa, sb) >= cfg.min_improvement_threshold:
        return await _admit(run, state, prompt, kind="merge", base=base, score_after=after), True
    reason = f"minibatch score {after:.3f} below the better parent's {max(sa, sb):.3f}"
    return _refuse(run, state, prompt, reason, kind="merge", score_after=after, **base), True


@tracing.op(
    "art_rlvr.gepa.iteration",
    inputs=tracing.gepa_iteration_inputs,
    output=tracing.gepa_iteration_output,
)
async def _iteration(run: _Run, state: GEPAState) -> GEPAState:
    if run.config.use_merge and state.merges_due > 0:
        state, used = await _merge(run, state)
        if used:
            return (
                state
                if state.stop_reason
                else state.model_copy(update={"iteration": state.iteration + 1})
            )
    state = await _reflective(run, state)
    if state.stop_reason and state.stop_reason.startswith("budget"):
        return state  # nothing of this iteration happened
    return state.model_copy(update={"iteration": state.iteration + 1})


def make_reflector(
    model: art.Model, config: GEPAConfig, counters: LLMCounters
) -> tuple[LLMClient, str]:
    """The configured reflection LM, or the embedded model through its own endpoint."""
    return client_for(
        config.reflection_settings(),
        model,
        role="reflection",
        key_name="reflection_model",
        counters=counters,
        overrides=config.reflection_overrides(),
    )


async def report_prompts(
    model: art.Model, task: Task, prompts: Sequence[str], config: GEPAConfig
) -> dict[str, EvalReport]:
    """Greedy val accuracy of each distinct prompt (outside the optimization budget)."""
    val = task.splits["val"]
    if config.report_val_limit == 0 or not val:
        return {}
    scenarios = val[: config.report_val_limit] if config.report_val_limit else val
    sampling = SamplingConfig(
        max_tokens=config.report_max_tokens or config.max_tokens, temperature=0.0
    )
    return {
        p: await evaluate(model, scenarios, system_prompt=p, sampling=sampling, split="val")
        for p in dict.fromkeys(prompts)
    }


async def run_optimizer(
    model: art.Model,
    task: Task,
    *,
    seed_prompt: str | None = None,
    config: GEPAConfig,
    run_dir: Path | str | None = None,
    on_event: Callable[[HistoryEvent], None] | None = None,
    carry: Sequence[str] = (),
) -> tuple[GEPAResult, dict[str, EvalReport]]:
    """The whole run; returns the result and the val reports behind its accuracies.

    `carry`: prompts kept from an earlier phase (GEPA + RL keeps its frontier across rounds);
    they join the seed in the initial pool and are re-scored, within the budget, because the
    weights they were scored with have changed."""
    cfg = config
    began = time.monotonic()
    seed_prompt = (
        seed_prompt
        if seed_prompt is not None
        else cfg.seed_prompt
        if cfg.seed_prompt is not None
        else task.default_system_prompt
    )
    if len(seed_prompt) > cfg.max_prompt_chars:
        raise ValueError(f"the seed prompt is over max_prompt_chars={cfg.max_prompt_chars}")
    files = GEPAFiles(Path(run_dir) if run_dir is not None else None)
    pareto, feedback = split_train(task.splits["train"], cfg.pareto_size, cfg.seed)
    starts = list(dict.fromkeys([seed_prompt, *carry]))
    fp = fingerprint(cfg, task, "\n---\n".join(starts), [sc.id for sc in pareto])
    state = files.load_state()
    if state is not None and state.fingerprint != fp:
        raise ValueError(
            f"{files.root} holds a GEPA run with other settings (seed, sizes, seed prompt or "
            "task differ); use a new folder to start over"
        )
    if state is None:
        state = GEPAState(fingerprint=fp)
    else:
        log.info("resuming GEPA at iteration %d (%s)", state.iteration, files.root)
        state = reopen(state, cfg)
    records = files.journal.load()
    replies = {r["key"]: r for r in records if r.get("type") == "reflection"}
    last = [r["counters"] for r in records if r.get("type") == "reflection"]
    counters = LLMCounters.restore(last[-1]) if last else LLMCounters()
    store = EvalStore(cfg.max_metric_calls, files.journal)
    client, reflector = make_reflector(model, cfg, counters)
    adapter = ARTPromptAdapter(
        model,
        store,
        sampling=SamplingConfig(
            max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p
        ),
        rollouts_per_problem=cfg.rollouts_per_problem,
        seed=rollout_seed(cfg.seed, "gepa"),
        max_reflection_examples=cfg.max_reflection_examples,
        loop=asyncio.get_running_loop(),
    )
    run = _Run(cfg, adapter, store, files.journal, client, replies, pareto, feedback)
    if not state.candidates:
        need = sum(run.cost(p, pareto) for p in starts)
        if need > store.remaining:
            raise ValueError(
                f"max_metric_calls={cfg.max_metric_calls} cannot even score the "
                f"{len(starts)} starting prompt(s) on the Pareto set ({need} calls)"
            )
        initial = []
        for index, prompt in enumerate(starts):
            evals = await adapter.aevaluate(pareto, prompt)
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
                len(pareto),
            )
        state = state.model_copy(
            update={"candidates": tuple(initial), "pool": tuple(range(len(initial)))}
        )
        files.save(state)
    while state.stop_reason is None:
        if cfg.max_iterations is not None and state.iteration >= cfg.max_iterations:
            state = _stop(state, f"max_iterations: {cfg.max_iterations} iterations done")
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
    reports = await report_prompts(model, task, [seed_prompt, best.prompt], cfg)
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
    task: Task,
    *,
    seed_prompt: str | None = None,
    config: GEPAConfig | None = None,
    run_dir: Path | str | None = None,
    carry: Sequence[str] = (),
) -> GEPAResult:
    """Evolve `seed_prompt` (default: the config's, else the task's) for `model` on `task`
    (`carry`: more starting prompts, e.g. an earlier frontier).

    For notebooks: `result = await optimize_prompt(model, task, config=GEPAConfig(...))`.
    With `run_dir`, the run is journaled there and resumes where it stopped."""
    result, _ = await run_optimizer(
        model,
        task,
        seed_prompt=seed_prompt,
        config=config or GEPAConfig(),
        run_dir=run_dir,
        carry=carry,
    )
    return result
