"""The data stages of an expert-iteration round: plain functions from one stage's data to the
next, with no model, teacher or backend call (those are in `ei.expert`).

`select_solved` sorts the clean attempts; `relabel_hinted` turns hinted episodes into clean
ones and keeps those in which no turn carries the hint; `hinted_training_data` makes examples
and RL groups of them; `round_stats` counts what happened.
"""

from __future__ import annotations

import logging
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import art

from art_rlvr.core.outcome import is_correct, is_sampled, turns
from art_rlvr.core.transcript import episode_text
from art_rlvr.ei.config import EIConfig, record_field
from art_rlvr.ei.data import DistillExample, HintRecord, RLGroup, RoundStats
from art_rlvr.ei.hints import HintOutcome
from art_rlvr.ei.relabel import (
    best_attempts,
    example_from,
    hint_leaks,
    opening_of,
    relabel_hinted_episode,
    rl_group,
    shared_opening,
)
from art_rlvr.scenarios.scenario import Example

log = logging.getLogger(__name__)


def gold_answer(example: Example, field: str) -> str:
    return str(record_field(example.x, field)).strip()


def reference_solution(example: Example, field: str | None) -> str | None:
    value = record_field(example.x, field) if field else None
    return (str(value).strip() or None) if value is not None else None


# a failed multi-turn attempt shown to the teacher is trimmed to this many characters
ATTEMPT_CHARS = 1500


def attempt_text(trajectory: art.Trajectory) -> str:
    """An attempt as the teacher reads it: the reply of a single-turn rollout, or every turn
    of an episode after its opening (tool calls and results, the environment's replies),
    trimmed as GEPA's reflection trims it (art_rlvr.core.transcript: the last and the failing
    turns stay)."""
    return episode_text(turns(trajectory)[len(opening_of(trajectory)) :], ATTEMPT_CHARS).strip()


def most_common_failure(trajectories: Sequence[art.Trajectory]) -> str | None:
    """The failed attempt the teacher is shown: the most frequent wrong one (first on ties)."""
    wrong = Counter(attempt_text(t) for t in trajectories if not is_correct(t))
    return wrong.most_common(1)[0][0] if wrong else None


@dataclass(frozen=True)
class Selection:
    """The clean attempts sorted: training data from the solved scenarios, and the rest."""

    examples: list[DistillExample]
    rl_groups: list[RLGroup]
    unsolved: list[tuple[Example, art.TrajectoryGroup]]
    attempts: int
    correct: int


def select_solved(
    groups: Sequence[art.TrajectoryGroup],
    batch: Sequence[Example],
    config: EIConfig,
    system_prompt: str | None,
) -> Selection:
    """A solved scenario gives its best clean attempts (and its whole group, for
    `distill=rl`); an unsolved one goes on to the teacher."""
    by_id = {example.id: example for example in batch}
    examples: list[DistillExample] = []
    rl_groups: list[RLGroup] = []
    unsolved: list[tuple[Example, art.TrajectoryGroup]] = []
    for group in groups:
        example = by_id[group.trajectories[0].metadata["scenario_id"]]
        trajectories = list(group.trajectories)
        best = best_attempts(trajectories, config.keep_per_x)
        if not best:
            unsolved.append((example, group))
            continue
        examples += [example_from(example, system_prompt, t, "clean") for t in best]
        messages = shared_opening(example, system_prompt)
        rl_groups.append(rl_group(example.id, messages, [(t, False) for t in trajectories]))
    trajectories = [t for g in groups for t in g.trajectories]
    return Selection(
        examples, rl_groups, unsolved, len(trajectories), sum(map(is_correct, trajectories))
    )


@dataclass(frozen=True)
class Hinted:
    """One unsolved scenario after the teacher: its clean group, the hint outcome, and the
    hinted group (None without a hint, or when its rollouts failed: `error`)."""

    example: Example
    clean: art.TrajectoryGroup
    outcome: HintOutcome
    group: art.TrajectoryGroup | None
    error: str | None = None


@dataclass(frozen=True)
class Recovered:
    """A hinted scenario solved: its best episodes, already relabelled to the clean prompt."""

    hinted: Hinted
    best: list[art.Trajectory]


@dataclass(frozen=True)
class Verified:
    """What the hinted rollouts gave: recovered scenarios, hint records with their hinted
    counts, and the counters of the round's statistics."""

    recovered: list[Recovered]
    records: list[HintRecord]
    attempts: int = 0
    correct: int = 0
    echoed: int = 0  # correct relabelled episodes dropped because a turn carries the hint
    unrelabelled: int = 0  # a rollout function's hinted episodes without the hinted prompt


def relabel_hinted(
    hinted: Sequence[Hinted], config: EIConfig, system_prompt: str | None
) -> Verified:
    """Relabel every hinted episode to the clean prompt and keep the best correct ones in
    which no turn carries the hint (`hint_leaks`)."""
    recovered: list[Recovered] = []
    records: list[HintRecord] = []
    attempts = correct = echoed = unrelabelled = 0
    for retry in hinted:
        record, hint = retry.outcome.record, retry.outcome.hint
        if retry.group is not None and hint is not None:
            group = retry.group.trajectories
            relabelled = [
                t
                for t in (
                    relabel_hinted_episode(retry.example, system_prompt, t, hint) for t in group
                )
                if t is not None
            ]
            usable = [t for t in relabelled if not hint_leaks(t, hint, len(opening_of(t)))]
            solved = sum(map(is_correct, group))
            attempts, correct = attempts + len(group), correct + solved
            echoed += sum(map(is_correct, relabelled)) - sum(map(is_correct, usable))
            unrelabelled += len(group) - len(relabelled)
            record = record.model_copy(
                update={"hinted_attempts": len(group), "hinted_correct": solved}
            )
            if best := best_attempts(usable, config.keep_per_x):
                recovered.append(Recovered(retry, best))
        records.append(record)
    if unrelabelled:
        log.warning(
            "%d hinted episodes of the rollout function did not send the hinted system prompt "
            "(context.system_prompt) verbatim as a system message before their first sampled "
            "turn: they cannot be relabelled to the clean prompt and are not distilled",
            unrelabelled,
        )
    return Verified(recovered, records, attempts, correct, echoed, unrelabelled)


def single_reply(trajectory: art.Trajectory) -> bool:
    """One prompt, one sampled reply: the shape `score_completions` can score."""
    items = list(trajectory.messages_and_choices)
    return sum(map(is_sampled, items)) == 1 and is_sampled(items[-1])


def hinted_training_data(
    recovered: Sequence[Recovered],
    reliance: Sequence[float] | None,
    system_prompt: str | None,
) -> tuple[list[DistillExample], list[RLGroup], list[float]]:
    """Examples from the relabelled episodes, and for `distill=rl` a group of them beside
    the scenario's failed clean attempts; also reliance per completion token."""
    values = iter(reliance) if reliance is not None else None
    examples: list[DistillExample] = []
    groups: list[RLGroup] = []
    per_token: list[float] = []
    for r in recovered:
        example = r.hinted.example
        for t in r.best:
            value = next(values) if values is not None else None
            if value is not None:
                per_token.append(value / max(1.0, float(t.metrics.get("completion_tokens", 1))))
            examples.append(example_from(example, system_prompt, t, "hinted", value))
        failed = [(t, False) for t in r.hinted.clean.trajectories if not is_correct(t)]
        messages = shared_opening(example, system_prompt)
        groups.append(rl_group(example.id, messages, [*((t, True) for t in r.best), *failed]))
    return examples, groups, per_token


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def round_stats(
    round_index: int,
    *,
    config: EIConfig,
    batch_size: int,
    groups: int,
    selection: Selection,
    hinted: Sequence[Hinted],
    verified: Verified,
    examples: Sequence[DistillExample],
    rl_groups: Sequence[RLGroup],
    reliance: Sequence[float] | None,
    per_token: Sequence[float],
    seconds: tuple[float, float],
) -> RoundStats:
    """The round's numbers (`batch_size`: the examples sampled, `groups`: the groups that came
    back); `seconds` is (sampling, teacher and hinted rollouts)."""
    outcomes = [h.outcome for h in hinted]
    solved = groups - len(selection.unsolved)
    return RoundStats(
        round=round_index,
        scenarios=groups,
        clean_attempts=selection.attempts,
        clean_accuracy=_ratio(selection.correct, selection.attempts) or 0.0,
        clean_solved=solved,
        clean_solve_rate=_ratio(solved, groups) or 0.0,
        rollout_errors=batch_size - groups + sum(h.error is not None for h in hinted),
        hints_requested=len(outcomes),
        hints_generated=sum(o.hint is not None for o in outcomes),
        hints_leak_rejected=sum(o.leak_rejected for o in outcomes),
        hints_truncated=sum(o.record.truncated for o in outcomes),
        hints_dropped=sum(o.record.dropped in ("leak", "empty") for o in outcomes),
        teacher_errors=sum(o.record.dropped == "teacher_error" for o in outcomes),
        hinted_attempts=verified.attempts,
        hinted_accuracy=_ratio(verified.correct, verified.attempts),
        hinted_solve_rate=_ratio(
            len(verified.recovered), sum(o.hint is not None for o in outcomes)
        ),
        hinted_echo_rejected=verified.echoed,
        hinted_unrelabelled=verified.unrelabelled,
        recovered=len(verified.recovered),
        examples_distilled=len(examples),
        examples_from_hints=sum(e.source == "hinted" for e in examples),
        hint_reliance_mean=_mean(reliance) if reliance else None,
        hint_reliance_per_token=_mean(per_token) if per_token else None,
        rl_groups=sum(len(set(g.rewards)) > 1 for g in rl_groups) if config.distill == "rl" else 0,
        seconds_sampling=seconds[0],
        seconds_teacher=seconds[1],
    )
